// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_RETRY_LAYER_HPP
#define SLUICE_RETRY_LAYER_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/retry.hpp>

#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace sluice {

/// A policy layer that re-runs the layers inside it with `sluice::retry`:
/// `sluice::retry_layer({.first = 100ms, .attempts = 4, .budget = &budget})`.
///
/// Each attempt goes through every inner layer again: a limit inside is
/// released during the backoff and taken again (the attempt re-queues); a
/// limit outside is held through the backoff. Waits, hints, budget,
/// cancellation and what is rethrown: as `sluice::retry`. `retries()` counts
/// the attempts after the first of each call. Thread-safe: the counter is
/// atomic and a `retry_budget` may be shared by every thread of a server.
class retry_layer {
 public:
  /// The layer with backoff `b`; throws `std::invalid_argument` as `retry` does.
  explicit retry_layer(backoff b) : backoff_(std::move(b)) { detail::check_backoff(backoff_); }
  /// Moves the backoff and the retry count.
  retry_layer(retry_layer&& o) noexcept
      : backoff_(std::move(o.backoff_)), retries_(o.retries_.load()) {}

  /// `sluice::retry(backoff, next)`.
  template <class Next>
  auto call(Next next) -> std::invoke_result_t<Next&> {
    bool first = true;
    co_return co_await retry(backoff_, [&] {
      if (!std::exchange(first, false)) retries_.fetch_add(1, std::memory_order_relaxed);
      return next();
    });
  }

  /// Attempts after the first, over every call so far.
  [[nodiscard]] std::uint64_t retries() const noexcept {
    return retries_.load(std::memory_order_relaxed);
  }
  /// The backoff.
  [[nodiscard]] const backoff& policy() const noexcept { return backoff_; }

 private:
  backoff backoff_;
  std::atomic<std::uint64_t> retries_{0};
};

}  // namespace sluice

#endif  // SLUICE_RETRY_LAYER_HPP
