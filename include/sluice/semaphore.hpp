// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_SEMAPHORE_HPP
#define SLUICE_SEMAPHORE_HPP

#include <sluice/config.hpp>
#include <sluice/detail/count_arg.hpp>
#include <sluice/detail/permit_core.hpp>
#include <sluice/detail/unique_permit.hpp>
#include <sluice/overloaded_error.hpp>
#include <sluice/stats.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <system_error>
#include <type_traits>
#include <utility>

namespace sluice {

namespace detail {
struct budget_access;  // sluice::acquire_all's way in (detail/all_budgets.hpp)
}  // namespace detail

/// A loop-affine counting semaphore for coroutines: caps how many holders run
/// at once, with FIFO hand-off and cancellation that never loses a permit.
///
/// `release()` hands its permit straight to the oldest waiter (no barging):
/// `try_acquire()` fails while anyone waits, and a holder that releases and
/// acquires again queues behind the current waiters. A plain semaphore may be
/// released above its initial value; `bounded_semaphore` throws instead.
///
/// What resumes where: an uncontended `acquire()` does not suspend and costs
/// about one nested `co_await`. A waiter is never resumed inside `release()`:
/// its completion is posted to the handler's associated executor (a
/// coroutine's own executor); a handler without one (a bare lambda) runs on
/// the semaphore's executor, and giving one to a semaphore constructed without
/// an executor throws `std::invalid_argument`. `use_future` futures are made
/// ready from Asio's system executor.
///
/// Per-Operation Cancellation: `async_acquire` supports terminal, partial and
/// total cancellation through the handler's cancellation slot (a coroutine's
/// own cancellation state). Cancellation is atomic: a waiter is either removed
/// (it completes with `asio::error::operation_aborted` and holds nothing) or
/// was already granted (it completes successfully and holds the permit). The
/// awaitable `acquire()` / `scoped_acquire()` go one step further: if the
/// coroutine was cancelled after the grant but before it resumed, the permit is
/// handed on and `operation_aborted` is thrown, so racing them against a
/// timeout (`awaitable_operators ||`) never loses a permit. A coroutine whose
/// cancellation was requested before it called (one that runs on with
/// `throw_if_cancelled(false)`) is refused at once with `operation_aborted`,
/// by every form (`async_acquire` with a coroutine's handler too), even when
/// a permit is free: it takes nothing and never queues. A plain callback
/// cannot be known as cancelled before its call (a slot keeps no history).
///
/// Destroying a semaphore that still has waiters completes them with
/// `operation_aborted`. Outstanding permits must not outlive it.
///
/// Loop-affine, not thread-safe: use it from one thread, or from one strand
/// when the io_context runs on several threads. With `SLUICE_AFFINITY_CHECKS`
/// (debug builds; compiled out with `NDEBUG`) every primitive (lock,
/// semaphore, event, condition, queue) checks each mutating or waiting call,
/// once it knows its `asio::io_context`: from the executor it was built with,
/// else from the first awaiting coroutine or waiting handler (io_context
/// executors, strands of them, or an `any_io_executor` holding either; a strand
/// seen there is remembered). It aborts with a message naming the primitive
/// when (1) two threads are inside it at once, (2) two different threads that
/// both run its io_context use it outside its strand (an io_context run by
/// several threads with no strand), or (3) a thread that does not run the loop
/// uses it while the loop, not stopped, last used it from another thread.
/// Accepted: any thread inside the strand; set-up before the loop first uses
/// it; the loop's own thread between `run()` calls; any thread once the loop
/// is stopped (reading after the loop's threads were joined). Also flagged,
/// since they cannot be told from a race: an io_context run by thread A and
/// later by thread B without a strand, and another thread's call after the
/// loop's thread left `poll()` / `run_for()` with work pending. Destructors
/// and the const diagnostics (`value()`, `waiters()`, ...) are not checked.
///
/// @code
/// sluice::semaphore sem{5};                 // at most 5 calls in flight
/// auto fetch_one = [&](std::string url) -> asio::awaitable<std::string> {
///   auto permit = co_await sem.scoped_acquire();   // released at scope exit
///   co_return co_await http_get(url);
/// };
/// metrics.gauge("free", sem.value()); metrics.gauge("waiting", sem.waiters());
/// @endcode
class semaphore {
 public:
  /// Move-only ownership of one permit: releases it on destruction (move,
  /// `reset()`, `explicit operator bool`). Must not outlive the semaphore.
  using permit = detail::unique_permit<semaphore>;

  /// A semaphore with `initial` permits and no executor: handlers that have no
  /// executor of their own are rejected. `initial` may be of any integer type
  /// (`sluice::semaphore sem{n}` with an `int n` is not a narrowing error);
  /// negative: `std::invalid_argument`.
  template <detail::count_integer I = std::size_t>
  explicit semaphore(I initial = 1)
      : semaphore("sluice::semaphore", detail::to_count(initial, "sluice::semaphore: initial"),
                  false, asio::any_io_executor{}) {}

  /// A semaphore with `initial` permits whose executor runs handlers that have
  /// no executor of their own. `initial` as above.
  template <class Executor, detail::count_integer I = std::size_t>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      semaphore(const Executor& ex, I initial = 1)
      : semaphore("sluice::semaphore", detail::to_count(initial, "sluice::semaphore: initial"),
                  false, asio::any_io_executor(ex)) {}

  /// A semaphore that sheds load: `sluice::semaphore cap{ex, 8, {.max_waiting = 64}}`.
  /// Past `shed.max_waiting` waiters, `acquire()` throws
  /// `sluice::overloaded_error` at once (`async_acquire` completes with
  /// `sluice::overloaded_code()`), nothing queued or taken; a waiter whose
  /// wait reaches `shed.max_wait` leaves the queue at that instant with the
  /// same error, holding nothing. Both are decided inside the wait, exactly
  /// (never a read of `waiters()`); a caller granted without a wait is never
  /// shed, and a pre-cancelled caller gets `operation_aborted` first. Counted
  /// in `stats().shed`. The `max_wait` timer runs on the executor of the last
  /// waiter queued, only while someone waits. Throws
  /// `std::invalid_argument` for a `shed.linger` (a policy layer's option)
  /// or a `max_wait` that is not positive. `ex` may be empty
  /// (`asio::any_io_executor{}`) for a semaphore without one.
  template <class Executor, detail::count_integer I>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      semaphore(const Executor& ex, I initial, const shed_options& shed)
      : semaphore("sluice::semaphore", detail::to_count(initial, "sluice::semaphore: initial"),
                  false, asio::any_io_executor(ex), shed) {}

  semaphore(const semaphore&) = delete;
  semaphore& operator=(const semaphore&) = delete;

  /// Waits for a permit. Completion signature `void(error_code)`; the
  /// error is `asio::error::operation_aborted` if cancelled or if the semaphore
  /// is destroyed first. Completes through a post even when a permit is free.
  template <asio::completion_token_for<void(error_code)> CompletionToken>
  auto async_acquire(CompletionToken&& token) {
    return core_.async_acquire(std::forward<CompletionToken>(token));
  }

  /// Waits for a permit; does not suspend when one is free and nobody waits.
  /// Throws `system_error(operation_aborted)` when cancelled (holding
  /// nothing).
  template <class = void>  // a template: compiled only in the TUs that call it (issue 32)
  [[nodiscard]] asio::awaitable<void> acquire();

  /// As `acquire()`, returning a `permit` that releases on destruction.
  template <class = void>  // a template: compiled only in the TUs that call it (issue 32)
  [[nodiscard]] asio::awaitable<permit> scoped_acquire();

  /// Takes a permit if one is free and nobody waits; never suspends.
  [[nodiscard]] SLUICE_DECL bool try_acquire();

  /// Returns a permit: to the oldest waiter if any (resumed through a post),
  /// otherwise to the pool. `bounded_semaphore` throws `std::logic_error`
  /// instead of exceeding its initial value.
  SLUICE_DECL void release();

  /// Free permits now.
  [[nodiscard]] std::size_t value() const noexcept { return core_.value(); }
  /// Operations waiting for a permit now.
  [[nodiscard]] std::size_t waiters() const noexcept { return core_.waiters(); }
  /// The most operations that ever waited at once (high-water mark).
  [[nodiscard]] std::size_t max_waiters() const noexcept { return core_.max_waiters(); }
  /// True when no permit is free or anyone waits: an `acquire()` would suspend.
  [[nodiscard]] bool locked() const noexcept { return core_.locked(); }

  /// What the semaphore has done and is doing (see `sluice::stats`): grants,
  /// cancelled waits, waiting and held now (`in_use`: permits taken and not
  /// given back), `limit` (the initial value), the wait of every grant and
  /// the hold of every `permit`. O(buckets), allocates nothing. Read it on the
  /// semaphore's loop (or after the loop's threads were joined).
  [[nodiscard]] SLUICE_DECL sluice::stats stats() const noexcept;

  /// Destroys the semaphore; nothing may wait on it or hold a permit of it.
  SLUICE_DECL ~semaphore();

 protected:
  /// For `bounded_semaphore`: `name` appears in diagnostics; `bounded` makes
  /// a release above `initial` throw; `shed` bounds the waiters.
  SLUICE_DECL semaphore(const char* name, std::size_t initial, bool bounded,
                        asio::any_io_executor ex);
  /// As above, with a shedding bound (a constructor of its own: only a TU
  /// that passes `shed_options` compiles the bound's timer).
  SLUICE_DECL semaphore(const char* name, std::size_t initial, bool bounded,
                        asio::any_io_executor ex, const shed_options& shed);

 private:
  friend permit;
  friend struct detail::budget_access;
  SLUICE_DECL void release_held(detail::clock::time_point since);

  detail::permit_core core_;
};

/// A `semaphore` that refuses to grow: `release()` beyond the initial value
/// throws `std::logic_error` (Python's `BoundedSemaphore`). Prefer it whenever
/// you call `acquire()` / `release()` by hand; a drifting count then fails
/// loudly at the offending call instead of silently raising the cap.
///
/// @code
/// sluice::bounded_semaphore sem{ex, 2};
/// co_await sem.acquire();
/// sem.release();
/// sem.release();   // throws std::logic_error: more releases than acquires
/// @endcode
class bounded_semaphore : public semaphore {
 public:
  /// A bounded semaphore with `initial` permits and no executor. `initial`
  /// may be of any integer type; negative: `std::invalid_argument`.
  template <detail::count_integer I = std::size_t>
  explicit bounded_semaphore(I initial = 1)
      : semaphore("sluice::bounded_semaphore",
                  detail::to_count(initial, "sluice::bounded_semaphore: initial"), true,
                  asio::any_io_executor{}) {}

  /// A bounded semaphore with `initial` permits and an executor for handlers
  /// that have none. `initial` as above.
  template <class Executor, detail::count_integer I = std::size_t>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      bounded_semaphore(const Executor& ex, I initial = 1)
      : semaphore("sluice::bounded_semaphore",
                  detail::to_count(initial, "sluice::bounded_semaphore: initial"), true,
                  asio::any_io_executor(ex)) {}

  /// A bounded semaphore that sheds load past `shed` (see `semaphore`'s
  /// constructor with `shed_options`).
  template <class Executor, detail::count_integer I>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      bounded_semaphore(const Executor& ex, I initial, const shed_options& shed)
      : semaphore("sluice::bounded_semaphore",
                  detail::to_count(initial, "sluice::bounded_semaphore: initial"), true,
                  asio::any_io_executor(ex), shed) {}
};

template <class>
asio::awaitable<void> semaphore::acquire() {
  return core_.acquire();
}

template <class>
asio::awaitable<semaphore::permit> semaphore::scoped_acquire() {
  return core_.acquire_held(
      [this] { core_.release(""); },
      [this](detail::clock::time_point since) { return permit(*this, since); });
}

#if defined(SLUICE_SEPARATE_COMPILATION)
extern template asio::awaitable<void> semaphore::acquire<void>();
extern template asio::awaitable<semaphore::permit> semaphore::scoped_acquire<void>();
#endif

}  // namespace sluice

#if SLUICE_HEADER_DEFS
#include <sluice/impl/semaphore.ipp>
#endif

#endif  // SLUICE_SEMAPHORE_HPP
