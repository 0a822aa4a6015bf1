// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_OVERLOADED_ERROR_HPP
#define SLUICE_OVERLOADED_ERROR_HPP

// Shedding's vocabulary: the bounds (shed_options), the exception past them
// (overloaded_error) and its error code for completion tokens. Light on
// purpose: every limit header includes it.

#include <sluice/config.hpp>
#include <sluice/retry_after.hpp>

#include <sluice/detail/virtual_clock.hpp>

#include <chrono>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <system_error>

namespace sluice {

/// A bound on how many callers may wait for a limit and for how long, past
/// which a call fails at once with `sluice::overloaded_error` (load
/// shedding). One struct for both places that shed: the option of every
/// limit kind (`sluice::semaphore sem{ex, 8, {.max_waiting = 64}}`, checked
/// inside the limit's own wait) and the `sluice::shed` policy layer.
/// Designated initializers: `{.max_waiting = 64, .max_wait = 2s, .retry_after = 1s}`.
struct shed_options {
  /// Callers allowed to wait at once; one more is shed at once, nothing
  /// queued. 0: only calls granted without a wait pass.
  std::size_t max_waiting = std::numeric_limits<std::size_t>::max();
  /// A caller whose wait reaches this long is taken out of the queue and
  /// fails with `overloaded_error` at that instant
  /// (`clock::duration::max()`: no bound).
  detail::saturating_duration max_wait = detail::clock::duration::max();
  /// The Retry-After that `overloaded_error` suggests.
  detail::saturating_duration retry_after = std::chrono::seconds(1);
  /// The `sluice::shed` layer only: a call abandoned by a timeout or a
  /// cancellation keeps its permit this long after it ended (provider-side
  /// accounting; see `sluice::limits_layer`). A limit given a non-zero
  /// linger throws `std::invalid_argument`.
  detail::saturating_duration linger = detail::clock::duration::zero();
};

/// Thrown at once past a shedding bound (a limit's `shed_options`, or a
/// `sluice::shed` layer): the call was not queued and took nothing. Carries
/// a suggested Retry-After (a `sluice::retry_after`), so `sluice::retryable`
/// retries it and `sluice::retry` waits exactly that long; a server answers
/// it with HTTP 429 or 503 and `Retry-After: ceil(after)`.
class overloaded_error : public std::runtime_error, public retry_after {
 public:
  /// An overload; `after` is the suggested wait before trying again (any
  /// duration, saturated: `std::chrono::hours::max()` is
  /// `clock::duration::max()`, never an overflow at the call).
  explicit overloaded_error(detail::saturating_duration after, const char* why = "too many waiting")
      : std::runtime_error(std::string("sluice: overloaded: ") + why), retry_after{after} {}
};

namespace detail {

class overloaded_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "sluice.overloaded"; }
  std::string message(int) const override {
    return "sluice: overloaded: a shedding bound refused the wait";
  }
};

}  // namespace detail

/// The error code a limit's completion-token form (`async_acquire`)
/// completes with when its `shed_options` refuse the wait (too many waiting,
/// or the wait reached `max_wait`); the awaitable members throw
/// `sluice::overloaded_error` instead, carrying the limit's `retry_after`.
[[nodiscard]] inline error_code overloaded_code() noexcept {
  static const detail::overloaded_category_impl category;
  return error_code(std::error_code(1, category));
}

}  // namespace sluice

#endif  // SLUICE_OVERLOADED_ERROR_HPP
