// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_RETRY_BUDGET_HPP
#define SLUICE_RETRY_BUDGET_HPP

#include <sluice/config.hpp>
#include <sluice/detail/doubles.hpp>
#include <sluice/time.hpp>

#include <chrono>
#include <cstddef>
#include <deque>
#include <mutex>
#include <stdexcept>

namespace sluice {

namespace detail {
struct retry_budget_access;
}  // namespace detail

/// A retry budget shared by callers: retries in any window of `per` stay at
/// or below `ratio` times the first attempts in that window, plus
/// `min_retries` (as Finagle's RetryBudget and gRPC's retry throttling). When
/// an outage fails every call, retries add at most `ratio` to the load instead
/// of multiplying it by the attempt count; `sluice::retry` then lets the error
/// pass through at once.
///
/// - Counts exactly, over a sliding window (memory: one entry per distinct
///   instant with a first attempt or retry in the window).
/// - A retry is counted when `sluice::retry` decides on it (before its wait),
///   and given back if the caller is cancelled during that wait.
/// - What the counters say: `first_attempts()` and `retries()` are the
///   window's (what the cap compares; they fall as the window slides),
///   `retried()` and `refused()` run from construction (for metrics).
/// - Thread-safe: one budget may be shared by callers on any thread or
///   strand (every session of a multi-threaded server; a `retry_layer` in a
///   shared `sluice::policy`). Each decision takes a mutex for a few
///   instructions; the readers take it too. Callers on several threads read
///   the clock before they take the mutex, so an instant may arrive after a
///   later one: the window records it at the latest instant it has seen
///   (never earlier than the entries before it; the slide stays exact to
///   within that race).
/// - Time comes from the callers' clock (virtual under the test loop): do
///   not share one budget between a virtual loop and a real one.
/// - Throws `std::invalid_argument` for a `ratio` that is negative or not
///   finite, or `per <= 0`.
///
/// @code
/// sluice::retry_budget budget{{.ratio = 0.1, .per = 10s}};   // 10% of first attempts
/// auto policy = sluice::backoff{.first = 100ms, .attempts = 4, .budget = &budget};
/// co_await sluice::retry(policy, [&] { return call_api(req); });
/// @endcode
class retry_budget {
 public:
  /// The budget's parameters.
  struct options {
    double ratio = 0.1;                                  ///< retries per first attempt
    saturating_duration per = std::chrono::seconds(10);  ///< the window
    std::size_t min_retries = 0;                         ///< retries always allowed per window
  };

  /// Throws `std::invalid_argument` for a bad ratio or window.
  explicit retry_budget(options o) : opt_(o) {
    if (!(opt_.ratio >= 0.0) || !detail::is_finite(opt_.ratio))
      throw std::invalid_argument("sluice::retry_budget: ratio must be finite and >= 0");
    if (opt_.per <= clock::duration::zero())
      throw std::invalid_argument("sluice::retry_budget: the window `per` must be positive");
  }
  retry_budget(const retry_budget&) = delete;
  retry_budget& operator=(const retry_budget&) = delete;

  /// The parameters.
  [[nodiscard]] const options& config() const noexcept { return opt_; }
  /// First attempts in the sliding window, as of the budget's last use (a
  /// first attempt or a retry decision; reading does not move the window):
  /// the count the cap is a ratio of.
  [[nodiscard]] std::size_t first_attempts() const {
    const std::lock_guard lock(mutex_);
    return firsts_.total;
  }
  /// Retries in the sliding window, as of the budget's last use: the count
  /// the cap bounds. Windowed: retries older than `per` have left it, so
  /// after a quiet minute this reads 0 however many ran before. For a
  /// metric, read `retried()`.
  [[nodiscard]] std::size_t retries() const {
    const std::lock_guard lock(mutex_);
    return retries_.total;
  }
  /// Retries the budget allowed since construction, less those given back
  /// (their caller was cancelled during the wait): a counter for metrics.
  [[nodiscard]] std::size_t retried() const {
    const std::lock_guard lock(mutex_);
    return retried_;
  }
  /// Retries refused since construction (each let an error pass through).
  [[nodiscard]] std::size_t refused() const {
    const std::lock_guard lock(mutex_);
    return refused_;
  }

 private:
  friend struct detail::retry_budget_access;
  template <class Executor>
  void record_first_attempt(const Executor& /*ex*/, clock::time_point now) {
    const std::lock_guard lock(mutex_);
    firsts_.add(now);
    firsts_.expire(now, opt_.per);
    retries_.expire(now, opt_.per);
  }
  // Counts a retry at `now` if it fits; else counts a refusal.
  bool try_retry(clock::time_point now) {
    const std::lock_guard lock(mutex_);
    firsts_.expire(now, opt_.per);
    retries_.expire(now, opt_.per);
    const double allowed = opt_.ratio * static_cast<double>(firsts_.total) +
                           static_cast<double>(opt_.min_retries) + 1e-9;
    if (static_cast<double>(retries_.total + 1) > allowed) {
      ++refused_;
      return false;
    }
    retries_.add(now);
    ++retried_;
    return true;
  }
  // Forgets a retry counted at `at` that never ran (its caller was cancelled).
  void give_back(clock::time_point at) noexcept {
    const std::lock_guard lock(mutex_);  // lock() throws only on a misused mutex
    retries_.remove(at);
    --retried_;
  }
  // (instant, count) in increasing time; total is the sum of the counts.
  struct window {
    /// Retries counted at one instant.
    struct entry {
      clock::time_point at;  ///< the instant
      std::size_t count;     ///< retries counted at it
    };
    std::deque<entry> entries;
    std::size_t total = 0;
    // t earlier than the last entry (another thread's later reading came
    // first) is recorded at the last entry's instant: entries stay sorted.
    void add(clock::time_point t) {
      if (!entries.empty() && entries.back().at >= t) {
        ++entries.back().count;
      } else {
        entries.push_back({t, 1});
      }
      ++total;
    }
    void expire(clock::time_point now, clock::duration per) {
      while (!entries.empty() && entries.front().at + per <= now) {
        total -= entries.front().count;
        entries.pop_front();
      }
    }
    // Forgets one count added at `t`: the earliest entry at or after `t`
    // (add may have recorded it at a later instant).
    void remove(clock::time_point t) noexcept {
      auto found = entries.end();
      for (auto it = entries.end(); it != entries.begin();) {
        --it;
        if (it->at < t) break;
        found = it;
      }
      if (found == entries.end()) return;
      --total;
      if (--found->count == 0) entries.erase(found);
    }
  };

  options opt_;
  window firsts_, retries_;
  std::size_t retried_ = 0;
  std::size_t refused_ = 0;
  mutable std::mutex mutex_;
};

namespace detail {

// sluice::retry's way into a budget's private members.
struct retry_budget_access {
  template <class Executor>
  static void first_attempt(retry_budget& b, const Executor& ex, clock::time_point now) {
    b.record_first_attempt(ex, now);
  }
  static bool try_retry(retry_budget& b, clock::time_point now) { return b.try_retry(now); }
  static void give_back(retry_budget& b, clock::time_point at) noexcept { b.give_back(at); }
};

}  // namespace detail

}  // namespace sluice

#endif  // SLUICE_RETRY_BUDGET_HPP
