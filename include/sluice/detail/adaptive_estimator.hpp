// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_ADAPTIVE_ESTIMATOR_HPP
#define SLUICE_DETAIL_ADAPTIVE_ESTIMATOR_HPP

// The continuous limit an adaptive_limit follows, moved by one of the
// algorithms of sluice/adaptive_algorithms.hpp (Netflix's concurrency-limits:
// AIMD, Gradient, Vegas). It knows nothing of permits or waiters: the limit
// reads target() after each event and moves its integer limit there.

#include <sluice/adaptive_algorithms.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/doubles.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <variant>

namespace sluice::detail {

// Invariants: min_ <= estimate_ <= max_ after every event (clamped at each
// change, so successes at max do not pile up above it: a decrease then
// starts from max); epoch_ counts the decreases (a pushback from a permit
// granted before the last one reports the same congestion event).
class adaptive_estimator {
 public:
  using algorithm = std::variant<aimd, gradient, vegas>;

  adaptive_estimator(std::size_t initial, std::size_t min, std::size_t max, algorithm a) noexcept
      : min_(min), max_(max), estimate_(static_cast<double>(initial)), algorithm_(a) {}

  // Throws std::invalid_argument (through `fail`, which throws) for parameters
  // out of range.
  SLUICE_DECL static void check(const algorithm& algo, void (*fail)(const std::string&));

  // The integer limit the estimate stands for: floor(estimate_) in [min, max].
  // Compared as doubles first: a max near 2^64 rounds up to 2^64, which does
  // not convert back to std::size_t.
  [[nodiscard]] std::size_t target() const noexcept {
    return detail::floor(estimate_) >= static_cast<double>(max_)
               ? max_
               : std::clamp(static_cast<std::size_t>(detail::floor(estimate_)), min_, max_);
  }
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }

  // Set by hand (clamped); the algorithm continues from there.
  void set(std::size_t n) noexcept {
    estimate_ = static_cast<double>(n);
    clamp();
  }

  // A throttle or a drop of a permit granted in `epoch`, with the limit at
  // `limit`: one multiplicative decrease per congestion event.
  SLUICE_DECL void on_pushback(std::uint64_t epoch, std::size_t limit);

  // A success of `latency_ns`, of a permit granted with `in_flight` held,
  // while the limit is `limit`.
  void on_success(double latency, std::size_t in_flight, std::size_t limit) {
    std::visit(
        [&](const auto& a) {
          using A = std::decay_t<decltype(a)>;
          const bool saturated = 2 * in_flight >= limit;
          if constexpr (std::is_same_v<A, aimd>) {
            if (saturated) grow(a.increase / estimate_);
          } else {
            observe_baseline(latency, a.baseline_window);
            round_sum_ += latency;
            if (++round_count_ < limit) return;
            const double mean = round_sum_ / static_cast<double>(round_count_);
            round_count_ = 0;
            round_sum_ = 0.0;
            const double base = baseline_ns();
            if (base <= 0.0 || mean <= 0.0) return;
            if constexpr (std::is_same_v<A, gradient>) {
              const double g = a.tolerance * base / mean;
              if (g < 1.0) {
                shrink(std::max(0.5, g));
              } else if (saturated) {
                grow(a.increase);
              }
            } else {
              const double queued = estimate_ * (1.0 - base / mean);
              if (queued > a.beta) {
                shrink((estimate_ - 1.0) / estimate_);
              } else if (queued < a.alpha && saturated) {
                grow(1.0);
              }
            }
          }
        },
        algorithm_);
  }

  // The no-load latency baseline in ns (gradient, vegas; 0 before a sample):
  // the lowest latency of the last one or two windows.
  [[nodiscard]] double baseline_ns() const noexcept {
    if (previous_min_ <= 0.0) return current_min_;
    if (current_min_ <= 0.0) return previous_min_;
    return std::min(previous_min_, current_min_);
  }

 private:
  // Additive growth, held below the last throttled level for `hold` successes.
  void grow(double delta) {
    const double next = estimate_ + delta;
    if (next >= ceiling_) {
      if (hold_left_ > 0) {
        --hold_left_;
        return;
      }
      ceiling_ = std::numeric_limits<double>::infinity();
    }
    estimate_ = next;
    clamp();
  }

  // A latency-driven decrease: a congestion event of its own.
  void shrink(double factor) {
    estimate_ *= factor;
    ++epoch_;
    clamp();
  }

  void observe_baseline(double latency, std::size_t window) {
    if (latency <= 0.0) return;
    if (current_min_ <= 0.0 || latency < current_min_) current_min_ = latency;
    if (++window_count_ >= window) {
      previous_min_ = current_min_;
      current_min_ = 0.0;
      window_count_ = 0;
    }
  }

  void clamp() noexcept {
    estimate_ = std::clamp(estimate_, static_cast<double>(min_), static_cast<double>(max_));
  }

  std::size_t min_, max_;
  double estimate_;
  algorithm algorithm_;
  std::uint64_t epoch_ = 0;                                   // bumped by each decrease
  double ceiling_ = std::numeric_limits<double>::infinity();  // the last throttled level
  std::size_t hold_left_ = 0;  // successes still to wait at the ceiling
  std::size_t round_count_ = 0;
  double round_sum_ = 0.0;
  double current_min_ = 0.0, previous_min_ = 0.0;
  std::size_t window_count_ = 0;
};

}  // namespace sluice::detail

#if SLUICE_HEADER_DEFS
#include <sluice/impl/adaptive_estimator.ipp>
#endif

#endif  // SLUICE_DETAIL_ADAPTIVE_ESTIMATOR_HPP
