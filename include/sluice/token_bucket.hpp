// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TOKEN_BUCKET_HPP
#define SLUICE_TOKEN_BUCKET_HPP

#include <sluice/config.hpp>
#include <sluice/detail/count_arg.hpp>
#include <sluice/detail/rate_api.hpp>
#include <sluice/overloaded_error.hpp>
#include <sluice/stats.hpp>
#include <sluice/time.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <system_error>
#include <utility>

namespace sluice {

/// A token bucket: `rate_per_second` tokens flow in, at most `burst` are held,
/// and it starts full. The smoothing limiter: after the initial burst, starts
/// are spaced `1 / rate` apart.
///
/// Which to pick: a provider that publishes "M per window" and counts a
/// rolling window is matched exactly by `sluice::rate_limiter{M, window}`
/// (never throttled, never slower than needed). A token bucket with the same
/// average rate is not safe against it: `token_bucket{1.0, 60}` in front of a
/// 60-per-minute provider lets 60 start at 0 s and the 61st at 1 s, while all
/// 60 are still in the provider's window: calls at 1 s ... 59 s are throttled. Use a
/// bucket when the provider itself is a token bucket (it states a burst and a
/// refill rate), or to spread load evenly; its `burst` must then not exceed the
/// provider's.
///
/// Same members and guarantees as `rate_limiter`: FIFO (a large `acquire(n)`
/// at the head is not starved and does not let smaller ones barge),
/// `try_acquire()` fails while others wait, per-operation cancellation with
/// nothing taken, time from the executor's context (exact in virtual time),
/// one timer per bucket, destruction aborts waiters. The refill interval is
/// kept in whole nanoseconds (exact for rates that divide 10^9 per second).
///
/// Throws `std::invalid_argument`: `rate_per_second <= 0` (or not finite, or
/// above 10^9), `burst == 0` at construction; `n == 0` or `n > burst` at the
/// call.
///
/// Members: `async_acquire(n, token)`, `acquire(n = 1)`, `try_acquire(n = 1)`,
/// `waiters()`, `max_waiters()` (documented in `detail::rate_limiter_api`).
///
/// @code
/// sluice::token_bucket tb{10.0, 20};      // 10 per second, bursts of 20
/// co_await tb.acquire();                  // one token
/// co_await tb.acquire(5);                 // five at once (FIFO)
/// if (!tb.try_acquire()) shed_load();
/// @endcode
class token_bucket : public detail::rate_limiter_api<detail::bucket> {
 public:
  /// `rate_per_second` tokens per second, at most `burst` held; starts full.
  /// `burst` may be of any integer type (no narrowing error for an `int`);
  /// zero or negative: `std::invalid_argument`.
  template <detail::count_integer I>
  token_bucket(double rate_per_second, I burst)
      : rate_limiter_api(
            name,
            detail::bucket(rate_per_second, detail::to_count(burst, "sluice::token_bucket: burst"),
                           name),
            asio::any_io_executor{}) {}

  /// As above, with an executor whose context's clock is used from the start.
  template <class Executor, detail::count_integer I>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      token_bucket(const Executor& ex, double rate_per_second, I burst)
      : rate_limiter_api(
            name,
            detail::bucket(rate_per_second, detail::to_count(burst, "sluice::token_bucket: burst"),
                           name),
            asio::any_io_executor(ex)) {}

  /// As above, shedding load past `shed` (as `rate_limiter`'s constructor
  /// with `shed_options`: a request whose tokens would take longer than
  /// `max_wait` to refill even at the head is refused at once).
  template <class Executor, detail::count_integer I>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      token_bucket(const Executor& ex, double rate_per_second, I burst, const shed_options& shed)
      : rate_limiter_api(
            name,
            detail::bucket(rate_per_second, detail::to_count(burst, "sluice::token_bucket: burst"),
                           name),
            asio::any_io_executor(ex), shed) {}

  /// The capacity.
  [[nodiscard]] std::size_t burst() const noexcept { return core_.policy().burst(); }
  /// Tokens available now (fractional while refilling), on the bucket's clock.
  [[nodiscard]] double tokens() const { return core_.policy().tokens(core_.now()); }

 private:
  static constexpr const char* name = "sluice::token_bucket";
};

}  // namespace sluice

#endif  // SLUICE_TOKEN_BUCKET_HPP
