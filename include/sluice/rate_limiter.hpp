// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_RATE_LIMITER_HPP
#define SLUICE_RATE_LIMITER_HPP

#include <sluice/config.hpp>
#include <sluice/detail/count_arg.hpp>
#include <sluice/detail/rate_api.hpp>
#include <sluice/overloaded_error.hpp>
#include <sluice/stats.hpp>
#include <sluice/time.hpp>

#include <sluice/detail/asio.hpp>

#include <chrono>
#include <cstddef>
#include <system_error>
#include <utility>

namespace sluice {

/// A sliding-window rate limiter: never more than `calls` acquisitions start
/// in ANY window of length `per`, however the window is aligned. It is what
/// providers publish ("60 requests per minute") and what a provider that
/// counts a rolling window enforces.
///
/// It keeps the grant times of the last `calls` acquisitions; when the window
/// is full, the next acquisition is granted exactly when the oldest start in
/// the window expires (`start + per`; in real time see below), so it is never
/// slower than the quota allows. A burst of `calls` at once is allowed; to spread calls evenly use
/// `sluice::token_bucket` instead.
///
/// - Real time: a provider counts a request when it *arrives*, some travel
///   time after this limiter granted it, and that time varies from call to
///   call; when the call that opened a window travelled longer than the one
///   that reuses its place, the provider still has it in its window and
///   answers 429 (over loopback TCP, counting from the grant, 2,000 calls at
///   a 500-per-second quota saw about 105 throttled). So on the steady clock:
///   1. a start taken through `sluice::acquire_all` counts in the window from
///      its call's completion (when the `all_held` is destroyed or released):
///      the provider counted the request before it answered, so the start
///      that reuses its place arrives at least `per` after it, whatever the
///      travel time. It costs one call's duration per window cycle;
///   2. every start counts for `per + margin()`: a travel-time margin,
///      `per / 100` by default (`set_margin(d)`), which must exceed the
///      variation of the travel time; for `acquire()`, whose call's end the
///      limiter does not see, it is the only guard.
///   Tested over real TCP against `examples/slow_server` with a
///   sliding-window quota: 2,000 calls at the quota through `acquire_all`,
///   zero throttled. In virtual time (`sluice::testing::virtual_loop`) starts
///   count from the grant for exactly `per`: every timing stays exact.
///   `keyed_rate_limiter` applies the same default margin.
/// - FIFO: waiters are served in arrival order. A large `acquire(n)` at the
///   head is granted as soon as n starts fit, and nothing behind it is granted
///   before it (no barging, no starvation); `try_acquire()` fails while anyone
///   waits.
/// - Time: read from the limiter's executor's context, else from the first
///   waiting coroutine's: virtual (exact) under `sluice::testing::virtual_loop`,
///   the steady clock otherwise. `try_acquire()` awaits nothing: on a limiter
///   built without an executor, a `try_acquire()` before any wait reads the
///   steady clock, and later use on a virtual loop throws `std::logic_error`;
///   give the executor for virtual time. Bound to a virtual loop, it throws
///   the same on any other one, also after the first was destroyed (its
///   recorded starts are on the dead loop's clock): one limiter per loop.
/// - Waiting uses one timer per limiter, armed for the instant the head waiter
///   can go; the timer is disarmed whenever nobody waits.
/// - What resumes where: as `sluice::semaphore` (never inline; posted to the
///   handler's associated executor, else the limiter's).
/// - Per-Operation Cancellation: terminal, partial and total. A cancelled
///   waiter takes nothing, and the waiters behind it are re-examined at once
///   (a small request blocked behind a cancelled large one goes now if it
///   fits). `acquire()` also takes nothing when the coroutine was cancelled
///   before the call, and gives its grant back when it is cancelled after the
///   grant but before it resumed.
/// - Throws `std::invalid_argument`: `calls == 0` or `per <= 0` at
///   construction; `n == 0` or `n > calls` at the call (not a hang).
/// - Destroying it with waiters completes them with `operation_aborted`.
///   Loop-affine like the other primitives (same debug-build affinity checks).
///
/// Members: `async_acquire(n, token)`, `acquire(n = 1)`, `try_acquire(n = 1)`,
/// `waiters()`, `max_waiters()` (documented in `detail::rate_limiter_api`).
///
/// @code
/// sluice::rate_limiter rpm{60, std::chrono::minutes(1)};   // the provider's quota
/// sluice::semaphore in_flight{4};                          // and its concurrency cap
/// auto assess = [&](doc d) -> asio::awaitable<verdict> {
///   auto permit = co_await in_flight.scoped_acquire();
///   co_await rpm.acquire();                                // a start inside the quota
///   co_return co_await llm.assess(d);
/// };
/// @endcode
class rate_limiter : public detail::rate_limiter_api<detail::sliding_window> {
 public:
  /// At most `calls` starts in any window of `per`; no executor (handlers
  /// without one are rejected; time comes from the first waiter). `calls`
  /// may be of any integer type (no narrowing error for an `int`); zero or
  /// negative: `std::invalid_argument`. `per` is any `std::chrono::duration`,
  /// saturated instead of overflowing.
  template <detail::count_integer I, class Rep, class Period>
  rate_limiter(I calls, std::chrono::duration<Rep, Period> per)
      : rate_limiter_api(
            name,
            detail::sliding_window(detail::to_count(calls, "sluice::rate_limiter: calls"),
                                   detail::saturate(per), name),
            asio::any_io_executor{}) {}

  /// As above, with an executor: its context's clock is used from the start
  /// (also by `try_acquire()`), and it runs handlers that have no executor.
  template <class Executor, detail::count_integer I, class Rep, class Period>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      rate_limiter(const Executor& ex, I calls, std::chrono::duration<Rep, Period> per)
      : rate_limiter_api(
            name,
            detail::sliding_window(detail::to_count(calls, "sluice::rate_limiter: calls"),
                                   detail::saturate(per), name),
            asio::any_io_executor(ex)) {}

  /// As above, shedding load past `shed`: `{ex, 60, 1min, {.max_waiting = 100}}`.
  /// A request is refused at once with `sluice::overloaded_error`
  /// (`async_acquire`: `sluice::overloaded_code()`), nothing queued or
  /// taken, when `shed.max_waiting` others wait, or when its wait would pass
  /// `shed.max_wait` even at the head of the queue (the window says when its
  /// units free up); one queued behind others whose wait reaches `max_wait`
  /// leaves at that instant with the same error (a grant due at that very
  /// instant wins). Decided inside the wait, exactly; a pre-cancelled caller
  /// gets `operation_aborted` first; counted in `stats().shed`. `ex` may be
  /// empty. Throws `std::invalid_argument` for a `shed.linger` or a
  /// `max_wait` that is not positive.
  template <class Executor, detail::count_integer I, class Rep, class Period>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      rate_limiter(const Executor& ex, I calls, std::chrono::duration<Rep, Period> per,
                   const shed_options& shed)
      : rate_limiter_api(
            name,
            detail::sliding_window(detail::to_count(calls, "sluice::rate_limiter: calls"),
                                   detail::saturate(per), name),
            asio::any_io_executor(ex), shed) {}

  /// The quota: starts per window.
  [[nodiscard]] std::size_t calls() const noexcept { return core_.policy().calls(); }
  /// The window length.
  [[nodiscard]] clock::duration per() const noexcept { return core_.policy().per(); }
  /// The real-time margin: on the steady clock a start counts for
  /// `per() + margin()` (default `per() / 100`); zero in virtual time.
  [[nodiscard]] clock::duration margin() const noexcept { return core_.policy().margin(); }
  /// Sets the real-time margin (>= 0; zero: exact, as in virtual time, and
  /// exposed to the travel time's variation). Applies to the starts in the
  /// window too. Throws `std::invalid_argument` for a negative margin.
  void set_margin(clock::duration m) { core_.policy().set_margin(m, name); }

 private:
  static constexpr const char* name = "sluice::rate_limiter";
};

}  // namespace sluice

#endif  // SLUICE_RATE_LIMITER_HPP
