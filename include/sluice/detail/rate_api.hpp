// SPDX-License-Identifier: BSL-1.0
// The public face shared by rate_limiter and token_bucket (rate_limiter_api)
// and the weighted budget they give acquire_all, over detail::rate_core.
#ifndef SLUICE_DETAIL_RATE_API_HPP
#define SLUICE_DETAIL_RATE_API_HPP

#include <sluice/detail/rate_core.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <stdexcept>
#include <utility>

namespace sluice::detail {

template <class Policy>
class rate_limiter_api;

// `n` units of one limiter as a budget of sluice::acquire_all.
template <class Policy>
struct weighted_units {
  rate_limiter_api<Policy>* limiter;
  std::size_t n;
};

// sluice::acquire_all's way to a limiter's core.
struct rate_access {
  template <class Policy>
  static rate_core<Policy>& core(rate_limiter_api<Policy>& api) noexcept {
    return api.core_;
  }
};

// The public members shared by rate_limiter and token_bucket (documented
// there), over one rate_core.
template <class Policy>
class rate_limiter_api {
 public:
  rate_limiter_api(const rate_limiter_api&) = delete;
  rate_limiter_api& operator=(const rate_limiter_api&) = delete;

  /// Waits until `n` units are free. Completion signature `void(error_code)`;
  /// `operation_aborted` if cancelled (nothing taken) or if the limiter is
  /// destroyed first. Completes through a post even when free. Throws
  /// `std::invalid_argument` at once for `n == 0` or an `n` that could never
  /// be granted.
  template <asio::completion_token_for<void(error_code)> CompletionToken>
  auto async_acquire(std::size_t n, CompletionToken&& token) {
    return core_.async_acquire(n, std::forward<CompletionToken>(token));
  }

  /// Waits until `n` units are free; does not suspend when they are and nobody
  /// waits. Throws `system_error(operation_aborted)` when cancelled (nothing
  /// taken), `std::invalid_argument` at the call for a bad `n`.
  [[nodiscard]] asio::awaitable<void> acquire(std::size_t n = 1) {
    core_.check(n);
    return core_.acquire(n);
  }

  /// Takes `n` units if they are free now and nobody waits; never suspends.
  [[nodiscard]] bool try_acquire(std::size_t n = 1) { return core_.try_acquire(n); }

  /// `n` units as a budget of `sluice::acquire_all`: `tpm.weighted(tokens)`
  /// takes `tokens` of a tokens-per-minute limiter together with the other
  /// budgets. Throws `std::invalid_argument` for an `n` that could never be
  /// granted (as `acquire(n)`).
  [[nodiscard]] weighted_units<Policy> weighted(std::size_t n) {
    core_.check(n);
    return {this, n};
  }

  /// Operations waiting now.
  [[nodiscard]] std::size_t waiters() const noexcept { return core_.waiters(); }
  /// The most operations that ever waited at once.
  [[nodiscard]] std::size_t max_waiters() const noexcept { return core_.max_waiters(); }

  /// What the limiter has done and is doing (see `sluice::stats`): requests
  /// granted (`acquire(n)` counts once), `throttled` (requests that had to
  /// wait, and `try_acquire` refusals), cancelled waits, waiting now, the
  /// wait of every grant (0 for those that did not wait); `in_use` is the
  /// units taken and not yet back (a `rate_limiter`: starts still in the
  /// window; a `token_bucket`: tokens taken and not refilled yet, `burst() -
  /// tokens()` rounded up, so `limit - in_use` whole tokens are free),
  /// `limit` the quota (`calls`, or `burst`); no hold time. On the limiter's clock; O(buckets)
  /// plus, for a window, the starts that expired since the last call. Allocates nothing.
  [[nodiscard]] sluice::stats stats() const { return core_.stats(); }

 protected:
  friend struct rate_access;

  rate_limiter_api(const char* name, Policy policy, asio::any_io_executor ex,
                   const shed_options& shed = {})
      : core_(name, std::move(policy), std::move(ex), shed) {}
  ~rate_limiter_api() = default;

  rate_core<Policy> core_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_RATE_API_HPP
