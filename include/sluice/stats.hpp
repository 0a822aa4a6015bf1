// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_STATS_HPP
#define SLUICE_STATS_HPP

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace sluice {

/// A summary of durations (waits or holds): how many, their sum, and
/// quantiles read from fixed logarithmic buckets.
///
/// The buckets: durations below 8 ns each have their own; above, every
/// power of two is split into 8 equal buckets (a bucket is at most 12.5% as
/// wide as its lower edge), up to 2^48 ns (~78 hours; longer ones count in the
/// last bucket). `p50` and `p99` are the upper edge of the bucket that holds
/// the quantile, clamped to [`min`, `max`]: never below the true quantile, at
/// most 12.5% above it, and exact when every duration is the same.
/// `count`, `total`, `min` and `max` are exact.
///
/// @code
/// sluice::stats s = sem.stats();
/// std::cout << "p99 wait " << std::chrono::duration<double>(s.wait.p99).count() << " s\n";
/// @endcode
struct duration_stats {
  std::uint64_t count = 0;           ///< durations recorded
  std::chrono::nanoseconds total{};  ///< their sum
  std::chrono::nanoseconds min{};    ///< the shortest (0 when `count == 0`)
  std::chrono::nanoseconds max{};    ///< the longest
  std::chrono::nanoseconds p50{};    ///< the median, to the bucket's upper edge
  std::chrono::nanoseconds p99{};    ///< the 99th percentile, to the bucket's upper edge

  /// `total / count`, or 0 when nothing was recorded.
  [[nodiscard]] std::chrono::nanoseconds mean() const noexcept {
    return count == 0 ? std::chrono::nanoseconds{0}
                      : total / static_cast<std::chrono::nanoseconds::rep>(count);
  }
};

/// What one limit has done and is doing: returned by `stats()` on
/// `semaphore`, `bounded_semaphore`, `lock`, `shared_semaphore`,
/// `keyed_semaphore`, `rate_limiter`, `token_bucket` and `keyed_rate_limiter`.
///
/// Counters run from the limit's construction; `waiting`, `in_use` and
/// `limit` are the values now. Keeping them costs each grant one increment;
/// only a wait that suspends and a timed permit's hold read the clock (the
/// executor's: virtual, and exact, under `sluice::testing::virtual_loop`).
/// Nothing is allocated per acquisition: the first timed event allocates the
/// limit's buckets once. Reading is O(buckets) and allocates nothing.
///
/// - `wait` counts every grant: one that did not suspend waited 0.
/// - `hold` times the permits of `scoped_acquire()` (a `permit` or `guard`,
///   from its grant to its release or destruction): under a virtual clock
///   every one; on the steady clock one in 16 (the 1st, 17th, ... of the
///   limit; of the thread, for `shared_semaphore`), since two clock reads
///   would triple the cost of an uncontended `scoped_acquire`. `hold.count`
///   is the number timed. `adaptive_limit` times every permit (it measures
///   their latency anyway). A bare `acquire()` / `release()` pair is counted
///   in `acquired` but has no hold time: the release cannot tell whose permit
///   it returns.
/// - `in_use` means units taken and not yet back, for every limit: permits
///   held; for a `rate_limiter`, starts still in its window; for a
///   `token_bucket`, tokens taken and not refilled yet (`burst() - tokens()`
///   rounded up: not the tokens available, which are `limit - in_use`).
///   Rate limiters have no hold (a start is not held).
///
/// @code
/// sluice::semaphore backend{5};
/// // ... later, from the loop that uses it:
/// sluice::stats s = backend.stats();
/// metrics.gauge("in_use", s.in_use);        // == s.limit with s.waiting > 0: the cap is tight
/// metrics.gauge("waiting", s.waiting);
/// metrics.summary("wait_p99_s", std::chrono::duration<double>(s.wait.p99).count());
/// @endcode
struct stats {
  /// Grants their callers got, so far (a request for n units counts once).
  /// A coroutine's grant counts when it resumes with it: one granted and
  /// cancelled before it resumed (it passes the grant on and throws
  /// `operation_aborted`) counts in `cancelled` only. Each wait counts once.
  std::uint64_t acquired = 0;
  /// Waits that ended cancelled (`operation_aborted`), holding nothing:
  /// removed from the queue, or granted and cancelled before they resumed.
  std::uint64_t cancelled = 0;
  std::uint64_t throttled = 0;  ///< limiters: requests the limit delayed or refused
  /// Calls the limit's `shed_options` refused (`overloaded_error`): past
  /// `max_waiting` at once, or taken out of the queue at `max_wait`.
  std::uint64_t shed = 0;
  std::size_t waiting = 0;  ///< operations waiting now
  std::size_t in_use = 0;   ///< permits held (units taken, for a limiter) now
  std::size_t limit = 0;    ///< the cap now (permits, calls per window, burst)
  duration_stats wait;      ///< from the request to its grant
  duration_stats hold;      ///< from a permit's grant to its release
};

}  // namespace sluice

#endif  // SLUICE_STATS_HPP
