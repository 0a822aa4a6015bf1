// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTING_QUOTA_HPP
#define SLUICE_TESTING_QUOTA_HPP

#include <sluice/config.hpp>
#include <sluice/time.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <deque>
#include <optional>
#include <set>
#include <utility>

namespace sluice::testing {

/// The provider's limit; a call over it is answered at once with `throttled_error`.
/// As `slow_service::options::quota` it counts every call; as
/// `slow_service::options::key_quota` it applies to each key separately.
/// Windows are sliding: a start counts in (t - window, t].
struct quota {
  std::size_t max_in_flight = 0;  ///< more than this many in flight is throttled (0: no limit)
  std::size_t calls_per_window =
      0;  ///< more than this many starts per `window` is throttled (0: no limit)
  /// The window `calls_per_window` and `tokens_per_window` count in.
  sluice::saturating_duration window{std::chrono::seconds(1)};  ///< any duration, saturated
  /// A weighted quota (an LLM's tokens per minute): a call's `tokens` (the
  /// third argument of `call`) added to those of the calls admitted in the
  /// window may not exceed this (0: no limit). A call heavier than the whole
  /// quota fails with `service_error` (it could never be admitted).
  std::size_t tokens_per_window = 0;
};

/// One step of the provider's capacity schedule: from `at` (since the
/// service's origin) on, a call that would make more than `max_in_flight` calls
/// in flight is throttled.
struct capacity_step {
  sluice::saturating_duration at;  ///< when this capacity starts (0 for the first step); saturated
  std::size_t max_in_flight;       ///< calls the provider serves at once from then on (>= 1)
};

}  // namespace sluice::testing

namespace sluice::detail {

// What a testing::quota counts for slow_service (globally, or per key):
// admitted starts and tokens in the window (expired ones dropped lazily), and
// the scheduled ends of the calls in flight. Windows are sliding: a start
// counts in (t - window, t], `window` being the quota's, scaled by the
// service's time_scale.
struct quota_window {
  std::size_t in_flight = 0;
  std::deque<std::pair<clock::time_point, std::size_t>> starts;  // (start, tokens)
  std::size_t tokens = 0;                                        // sum over `starts`
  std::multiset<clock::time_point> ends;

  // A call heavier than the whole window could never be admitted.
  [[nodiscard]] static bool too_heavy(const testing::quota& q, std::size_t tokens) noexcept {
    return q.tokens_per_window != 0 && tokens > q.tokens_per_window;
  }

  // If a call of `tokens` at `t` breaks `q`: the time until it would not
  // (the Retry-After hint); nullopt if it is admitted. Drops expired starts.
  std::optional<clock::duration> throttled(const testing::quota& q, clock::time_point t,
                                           std::size_t tokens, clock::duration window) {
    std::optional<clock::duration> wait;
    const auto longer = [&wait](clock::duration d) {
      wait = std::max(wait.value_or(clock::duration::zero()), d);
    };
    if (q.max_in_flight && in_flight >= q.max_in_flight)
      longer(*ends.begin() - t);  // the first call in flight ends
    if (!q.calls_per_window && !q.tokens_per_window) {
      starts.clear();
      this->tokens = 0;
      return wait;
    }
    while (!starts.empty() && starts.front().first <= t - window) {
      this->tokens -= starts.front().second;
      starts.pop_front();
    }
    if (q.calls_per_window && starts.size() >= q.calls_per_window)
      longer(starts[starts.size() - q.calls_per_window].first + window - t);
    if (q.tokens_per_window && this->tokens + tokens > q.tokens_per_window) {
      std::size_t freed = 0;  // tokens that leave the window, oldest first
      for (const auto& [at, n] : starts) {
        freed += n;
        if (this->tokens - freed + tokens <= q.tokens_per_window) {
          longer(at + window - t);
          break;
        }
      }
    }
    return wait;
  }

  // Counts an admitted call ending at `end` against the quota `q`.
  std::multiset<clock::time_point>::iterator admit(const testing::quota& q, clock::time_point t,
                                                   clock::time_point end, std::size_t tokens) {
    if (q.calls_per_window || q.tokens_per_window) {
      starts.emplace_back(t, tokens);
      this->tokens += tokens;
    }
    return ends.insert(end);
  }
};
}  // namespace sluice::detail

#endif  // SLUICE_TESTING_QUOTA_HPP
