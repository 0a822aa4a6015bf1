// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_SHARED_SEMAPHORE_HPP
#define SLUICE_SHARED_SEMAPHORE_HPP

#include <sluice/config.hpp>
#include <sluice/detail/shared_permit_core.hpp>
#include <sluice/detail/unique_permit.hpp>
#include <sluice/overloaded_error.hpp>
#include <sluice/stats.hpp>

#include <sluice/detail/asio.hpp>

#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace sluice {

namespace detail {
struct budget_access;  // sluice::acquire_all's way in (detail/all_budgets.hpp)
}  // namespace detail

/// A counting semaphore that coroutines on any number of threads and
/// `io_context`s share: a process-wide cap (8 requests in flight across 4
/// worker threads), where a `sluice::semaphore` per loop would multiply the cap
/// by the number of loops. The one sluice primitive that is thread-safe.
///
/// Same API and semantics as `sluice::semaphore`, across threads:
/// - FIFO and no barging: `release()` (from any thread) hands its permit
///   straight to the oldest waiter, whichever thread or loop it waits on;
///   `try_acquire()` fails while anyone waits.
/// - What resumes where: a waiter is never resumed inside `release()`; its
///   completion is posted to the handler's associated executor (a coroutine's
///   own executor), on that executor's thread. A handler with no executor of
///   its own runs on the semaphore's executor; without one it is rejected
///   with `std::invalid_argument`. While an operation waits, it counts as
///   outstanding work of its executor, so that loop's `run()` does not return
///   while a release may still come from another thread.
/// - Per-Operation Cancellation: terminal, partial and total, through the
///   handler's cancellation slot. Atomic across threads: a waiter is either
///   removed (completes with `operation_aborted`, holds nothing) or was granted
///   (completes successfully, holds the permit), never both and never lost,
///   even when a release on another thread races with the cancellation. As
///   Asio requires of any operation, request the cancellation from the
///   waiter's own executor (e.g. a timeout in the same coroutine). A
///   coroutine cancelled before it called is refused at once, free permit or
///   not, holding nothing (as `semaphore`).
///   `acquire()` / `scoped_acquire()` also hand on a permit granted after the
///   coroutine was cancelled, and throw `operation_aborted`.
///
/// Cost: an uncontended `acquire()` is one compare-and-swap on one atomic word
/// (plus the coroutine frame) and never suspends; an uncontended `release()`
/// is one compare-and-swap. Waiting, handing over and cancelling take a mutex
/// around an intrusive FIFO of waiters (no allocation beyond the operation).
///
/// Lifetimes: destroying the semaphore completes its waiters with
/// `operation_aborted`; their executors must still be alive then. Outstanding
/// permits must not outlive it.
///
/// @code
/// sluice::shared_semaphore cap{8};            // the whole process: 8 requests in flight
/// // on each of 4 threads, each running its own io_context:
/// auto fetch = [&](std::string url) -> asio::awaitable<page> {
///   auto permit = co_await cap.scoped_acquire();   // released at scope exit, any thread
///   co_return co_await http_get(url);
/// };
/// @endcode
class shared_semaphore {
 public:
  /// Move-only ownership of one permit: releases it on destruction, on any
  /// thread (move, `reset()`, `explicit operator bool`). Must not outlive the
  /// semaphore.
  using permit = detail::unique_permit<shared_semaphore>;

  /// A semaphore with `initial` permits (at most 2^32 - 1, else
  /// `std::invalid_argument`) and no executor: handlers that have no executor
  /// of their own are rejected.
  explicit shared_semaphore(std::size_t initial = 1) : core_(initial, asio::any_io_executor{}) {}

  /// A semaphore with `initial` permits whose executor runs handlers that have
  /// no executor of their own.
  template <class Executor>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      shared_semaphore(const Executor& ex, std::size_t initial = 1)
      : core_(initial, asio::any_io_executor(ex)) {}

  /// A semaphore that sheds load: `sluice::shared_semaphore cap{ex, 8, {.max_waiting = 64}}`.
  /// A caller that would wait behind `shed.max_waiting` others (counted
  /// exactly, under the semaphore's mutex, across every thread) gets
  /// `sluice::overloaded_error` carrying `shed.retry_after`
  /// (`async_acquire`: `sluice::overloaded_code()`), nothing queued or taken;
  /// counted in `stats().shed`. A bound on the wait's length is not an
  /// option here (its timer would have to live on some thread's loop): a
  /// `shed.max_wait` throws `std::invalid_argument`; bound it with the
  /// `sluice::shed(cap, {.max_wait = d})` policy layer. `ex` may be empty.
  template <class Executor>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      shared_semaphore(const Executor& ex, std::size_t initial, const shed_options& shed)
      : core_(initial, asio::any_io_executor(ex), checked(shed).max_waiting),
        retry_after_(shed.retry_after) {}

  shared_semaphore(const shared_semaphore&) = delete;
  shared_semaphore& operator=(const shared_semaphore&) = delete;

  /// Waits for a permit, from any thread. Completion signature
  /// `void(error_code)`; the error is `asio::error::operation_aborted` if
  /// cancelled or if the semaphore is destroyed first. Completes through a
  /// post even when a permit is free.
  template <asio::completion_token_for<void(error_code)> CompletionToken>
  auto async_acquire(CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(error_code)>(
        [this](auto&& handler) {
          detail::start_shared_wait(core_, std::forward<decltype(handler)>(handler),
                                    "sluice::shared_semaphore::async_acquire");
        },
        token);
  }

  /// Waits for a permit; does not suspend when one is free and nobody waits.
  /// Throws `system_error(operation_aborted)` when cancelled (holding
  /// nothing), `sluice::overloaded_error` past a `shed_options` bound.
  template <class = void>  // a template: compiled only in the TUs that call it (issue 32)
  [[nodiscard]] asio::awaitable<void> acquire() {
    auto state = co_await asio::this_coro::cancellation_state;
    detail::refuse_if_cancelled(state, "sluice::shared_semaphore::acquire");
    if (core_.try_acquire()) co_return;
    detail::pending_grant grant;  // counted here: a cancelled wait is not a grant
    try {
      co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(error_code)>(
          [this, &grant](auto&& handler) {
            detail::start_shared_wait(core_, std::forward<decltype(handler)>(handler),
                                      "sluice::shared_semaphore::acquire", &grant);
          },
          asio::use_awaitable_t<>{});
    } catch (const system_error& e) {
      if (e.code() == overloaded_code()) throw overloaded_error(retry_after_);  // never queued
      throw;
    }
    if (state.cancelled() != asio::cancellation_type::none) {
      core_.stats_sink().cancelled.fetch_add(1, std::memory_order_relaxed);
      core_.release();  // granted after the cancellation: pass it on
      throw system_error(asio::error::operation_aborted, "sluice::shared_semaphore::acquire");
    }
    detail::settle_grant(core_.stats_sink(), grant);
  }

  /// As `acquire()`, returning a `permit` that releases on destruction.
  template <class T = void>  // a template: compiled only in the TUs that call it (issue 32)
  [[nodiscard]] asio::awaitable<permit> scoped_acquire() {
    co_await acquire<T>();
    auto& sink = core_.stats_sink();
    if (!sink.bound()) sink.bind(co_await asio::this_coro::executor);
    co_return permit(*this, sink.hold_start());
  }

  /// Takes a permit if one is free and nobody waits; never suspends. One
  /// compare-and-swap.
  [[nodiscard]] bool try_acquire() noexcept { return core_.try_acquire(); }

  /// Returns a permit, from any thread: to the oldest waiter if any (resumed
  /// through a post to its executor), otherwise to the pool. Throws
  /// `std::logic_error` if the value would exceed 2^32 - 1.
  void release() { core_.release(); }

  /// Free permits now (a snapshot: other threads may change it at once).
  [[nodiscard]] std::size_t value() const noexcept { return core_.value(); }
  /// Operations waiting for a permit now (a snapshot).
  [[nodiscard]] std::size_t waiters() const noexcept { return core_.waiters(); }
  /// The most operations that ever waited at once (high-water mark).
  [[nodiscard]] std::size_t max_waiters() const { return core_.max_waiters(); }
  /// True when no permit is free or anyone waits: an `acquire()` would suspend.
  [[nodiscard]] bool locked() const noexcept { return value() == 0 || waiters() != 0; }

  /// What the semaphore has done and is doing (see `sluice::stats`), from
  /// any thread: a snapshot (each counter exact; other threads may move
  /// between them). `in_use` is the initial value minus the free permits,
  /// `limit` the initial value; `hold` counts every `permit`, released on
  /// whichever thread. Keeping the counts costs a grant one relaxed atomic
  /// increment. O(buckets), allocates nothing.
  [[nodiscard]] sluice::stats stats() const noexcept { return core_.stats(); }

 private:
  friend permit;
  friend struct detail::budget_access;
  void release_held(detail::clock::time_point since) {
    auto& sink = core_.stats_sink();
    sink.end_hold(since);
    release();
  }
  static const shed_options& checked(const shed_options& o) {
    if (o.linger != detail::clock::duration::zero() || o.max_wait != detail::clock::duration::max())
      throw std::invalid_argument(
          "sluice::shared_semaphore: of shed_options it takes max_waiting and retry_after; "
          "bound the wait with the sluice::shed(cap, {.max_wait = d}) policy layer");
    return o;
  }

  detail::shared_permit_core core_;
  detail::clock::duration retry_after_ = std::chrono::seconds(1);  // shed_options::retry_after
};

}  // namespace sluice

#endif  // SLUICE_SHARED_SEMAPHORE_HPP
