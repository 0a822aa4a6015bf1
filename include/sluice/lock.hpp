// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_LOCK_HPP
#define SLUICE_LOCK_HPP

#include <sluice/config.hpp>
#include <sluice/detail/permit_core.hpp>
#include <sluice/detail/unique_permit.hpp>
#include <sluice/stats.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <system_error>
#include <utility>

namespace sluice {

class condition;

/// A loop-affine mutual-exclusion lock for coroutines, held across `co_await`s
/// (Python's `asyncio.Lock`). Not reentrant: acquiring it again from the
/// holder deadlocks. Ownership is not tracked: any coroutine may release it.
///
/// FIFO, no barging: `release()` hands the lock straight to the oldest waiter;
/// `try_acquire()` fails while anyone waits.
///
/// What resumes where: an uncontended `acquire()` does not suspend. A waiter
/// is never resumed inside `release()`; its completion is posted to the
/// handler's associated executor (a coroutine's own), or to the lock's executor
/// for a handler without one. Such a handler given to a lock constructed
/// without an executor makes `async_acquire` throw `std::invalid_argument`.
///
/// Per-Operation Cancellation: `async_acquire` supports terminal, partial and
/// total cancellation. A waiter is either removed (completes with
/// `asio::error::operation_aborted`, holds nothing) or was granted (completes
/// successfully, holds the lock). `acquire()` / `scoped_acquire()` hand the lock
/// on and throw `operation_aborted` if the coroutine was cancelled after the
/// grant but before it resumed, so no cancellation leaves the lock held by
/// nobody. A coroutine cancelled before it called is refused at once, locked
/// or not, holding nothing (as `semaphore`).
///
/// Throws: `release()` of an unlocked lock throws `std::logic_error`.
/// Destroying a lock with waiters completes them with `operation_aborted`.
///
/// Loop-affine and not thread-safe; debug builds abort on use from a thread
/// that is not running its loop (see `semaphore` for exactly what is checked).
///
/// @code
/// sluice::lock token_lock;
/// auto token = [&]() -> asio::awaitable<std::string> {
///   auto guard = co_await token_lock.scoped_acquire();
///   if (cached.empty()) cached = co_await fetch_token();   // refresh once
///   co_return cached;
/// };
/// @endcode
class lock {
 public:
  /// Move-only ownership of the lock: releases it on destruction (move,
  /// `reset()`, `explicit operator bool`). Must not outlive the lock.
  using guard = detail::unique_permit<lock>;

  /// An unlocked lock without an executor.
  lock() : core_("sluice::lock", 1, true, asio::any_io_executor{}) {}

  /// An unlocked lock whose executor runs handlers that have none.
  template <class Executor>
  requires(asio::execution::is_executor<Executor>::value ||
           asio::is_executor<Executor>::value) explicit lock(const Executor& ex)
      : core_("sluice::lock", 1, true, asio::any_io_executor(ex)) {}

  lock(const lock&) = delete;
  lock& operator=(const lock&) = delete;

  /// Waits for the lock. Completion signature `void(error_code)`;
  /// `operation_aborted` if cancelled or if the lock is destroyed first.
  template <asio::completion_token_for<void(error_code)> CompletionToken>
  auto async_acquire(CompletionToken&& token) {
    return core_.async_acquire(std::forward<CompletionToken>(token));
  }

  /// Waits for the lock; does not suspend when it is free and nobody waits.
  [[nodiscard]] asio::awaitable<void> acquire() { return core_.acquire(); }

  /// As `acquire()`, returning a `guard` that releases on destruction.
  [[nodiscard]] asio::awaitable<guard> scoped_acquire() {
    co_await core_.acquire();
    if (!core_.clock_bound())
      co_return guard(*this, core_.hold_start(co_await asio::this_coro::executor));
    co_return guard(*this, core_.hold_start());
  }

  /// Takes the lock if it is free and nobody waits; never suspends.
  [[nodiscard]] bool try_acquire() { return core_.try_acquire(); }

  /// Unlocks, handing the lock to the oldest waiter if any (resumed through a
  /// post). Throws `std::logic_error` if the lock is not locked.
  void release() {
    core_.release(
        "sluice::lock::release: the lock is not locked (released more often than acquired)");
  }

  /// True while someone holds the lock.
  [[nodiscard]] bool locked() const noexcept { return core_.locked(); }
  /// Operations waiting for the lock now.
  [[nodiscard]] std::size_t waiters() const noexcept { return core_.waiters(); }
  /// The most operations that ever waited at once (high-water mark).
  [[nodiscard]] std::size_t max_waiters() const noexcept { return core_.max_waiters(); }

  /// What the lock has done and is doing (see `sluice::stats`): grants,
  /// cancelled waits, waiting now, `in_use` 1 while locked, `limit` 1, the wait
  /// of every grant and the hold of every `guard`. O(buckets), allocates
  /// nothing. Read it on the lock's loop.
  [[nodiscard]] sluice::stats stats() const noexcept { return core_.stats(); }

 private:
  friend class condition;
  friend guard;
  void release_held(detail::clock::time_point since) {
    core_.record_hold(since);
    release();
  }

  detail::permit_core core_;
};

}  // namespace sluice

#endif  // SLUICE_LOCK_HPP
