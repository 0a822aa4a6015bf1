// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_RATE_POLICY_HPP
#define SLUICE_DETAIL_RATE_POLICY_HPP

// The grant rules of the rate limiters: when n more units are free. Pure
// arithmetic on time points (no loop, no timer); rate_core.hpp queues the
// waiters over them.

#include <sluice/config.hpp>
#include <sluice/detail/doubles.hpp>
#include <sluice/detail/virtual_clock.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <deque>
#include <stdexcept>
#include <string>

namespace sluice::detail {

// The window of a sliding-window limiter: at most `calls` starts in any
// half-open window (t - per, t], the rule slow_service's quota enforces.
// On the steady clock a start stays in the window for per + margin (a
// travel-time allowance, default per / 100: the provider counts a request
// when it arrives, and that varies from call to call); on a virtual clock
// for exactly per (real_time(false), the default until a clock is bound).
// Invariants: starts_ holds (time, count) in increasing time, none expired as
// of the last expire(); used_ is the sum of the counts and never exceeds
// calls_; slack_ is margin_ on the steady clock and 0 on a virtual one.
class sliding_window {
 public:
  sliding_window(std::size_t calls, clock::duration per, const char* who)
      : calls_(calls), per_(per), margin_(per / 100) {
    if (calls == 0) throw std::invalid_argument(std::string(who) + ": calls must be at least 1");
    if (per <= clock::duration::zero())
      throw std::invalid_argument(std::string(who) + ": the window `per` must be positive");
  }

  // The clock the starts are recorded on: the steady one (the margin
  // applies) or a virtual one (exact).
  void real_time(bool real) noexcept {
    real_ = real;
    slack_ = real ? margin_ : clock::duration::zero();
  }
  void set_margin(clock::duration m, const char* who) {
    if (m < clock::duration::zero())
      throw std::invalid_argument(std::string(who) + ": the margin must be >= 0");
    margin_ = m;
    real_time(real_);
  }
  [[nodiscard]] clock::duration margin() const noexcept { return margin_; }

  void check(std::size_t n, const char* who) const {
    if (n == 0 || n > calls_)
      throw std::invalid_argument(std::string(who) + ": acquire(n) needs 1 <= n <= calls (" +
                                  std::to_string(calls_) + "), got " + std::to_string(n) +
                                  "; a larger n could never be granted");
  }

  // The earliest instant >= now at which n more starts fit: the k-th oldest
  // start in the window leaves it, k being the excess. Written so that no sum
  // wraps: calls_ and n may be SIZE_MAX, per_ may be duration::max().
  clock::time_point ready_at(std::size_t n, clock::time_point now) {
    expire(now);
    const std::size_t free = calls_ - used_;
    if (n <= free) return now;
    std::size_t k = n - free;
    for (const auto& s : starts_) {
      if (s.count >= k) return leaves_at(s.at);
      k -= s.count;
    }
    return now;  // unreachable: n <= calls_
  }

  // Records n starts at `now`; returns the grant's key for give_back: `now`.
  clock::time_point take(std::size_t n, clock::time_point now) {
    if (!starts_.empty() && starts_.back().at == now) {
      starts_.back().count += n;
    } else {
      starts_.push_back({now, n});
    }
    used_ += n;
    return now;
  }

  // Forgets n starts recorded at `at` (a grant that never started). False if
  // none is recorded there any more (expired).
  bool give_back(std::size_t n, clock::time_point at, clock::time_point /*now*/) {
    return give_back(n, at);
  }
  bool give_back(std::size_t n, clock::time_point at) {
    for (auto it = starts_.end(); it != starts_.begin();) {
      --it;
      if (it->at < at) return false;
      if (it->at == at) {
        const std::size_t k = std::min(n, it->count);
        it->count -= k;
        used_ -= k;
        if (it->count == 0) starts_.erase(it);
        return true;
      }
    }
    return false;
  }

  // n starts recorded at `at` count from `now` instead (their call has
  // completed: the provider counted it before it answered). Expired ones
  // stay gone. `now` is the latest time recorded, so the order holds.
  void restamp(std::size_t n, clock::time_point at, clock::time_point now) {
    if (at < now && give_back(n, at)) take(n, now);
  }

  // True when the window is empty at `now` (a fresh limiter).
  bool idle(clock::time_point now) {
    expire(now);
    return starts_.empty();
  }
  // The instant the window empties if nothing else starts.
  [[nodiscard]] clock::time_point idle_at() const noexcept {
    return starts_.empty() ? clock::time_point::min() : leaves_at(starts_.back().at);
  }

  [[nodiscard]] std::size_t calls() const noexcept { return calls_; }
  [[nodiscard]] clock::duration per() const noexcept { return per_; }

  // For stats(): the starts still in the window at `now`, and the quota.
  [[nodiscard]] std::size_t in_use(clock::time_point now) const noexcept {
    std::size_t used = used_;
    for (const auto& s : starts_) {
      if (leaves_at(s.at) > now) break;
      used -= s.count;
    }
    return used;
  }
  [[nodiscard]] std::size_t limit() const noexcept { return calls_; }

 private:
  struct start {
    clock::time_point at;
    std::size_t count;
  };
  // The instant a start at `at` leaves the window (after per_ plus the
  // real-time slack); time_point::max() (never) rather than a wrapped sum
  // for a window of duration::max().
  [[nodiscard]] clock::time_point leaves_at(clock::time_point at) const noexcept {
    return add_saturating(add_saturating(at, per_), slack_);
  }
  void expire(clock::time_point now) {
    while (!starts_.empty() && leaves_at(starts_.front().at) <= now) {
      used_ -= starts_.front().count;
      starts_.pop_front();
    }
  }

  std::size_t calls_;
  clock::duration per_;
  clock::duration margin_;
  clock::duration slack_{};
  bool real_ = false;
  std::size_t used_ = 0;
  std::deque<start> starts_;
};

// A token bucket as a GCRA: tat_ is the instant the bucket is full again; n
// tokens are free at t when tat_ - t <= (burst - n) * interval. The interval
// (1 / rate) is kept in whole nanoseconds: exact for rates that divide 1e9.
class bucket {
 public:
  bucket(double rate_per_second, std::size_t burst, const char* who) : burst_(burst) {
    if (!(rate_per_second > 0.0) || !is_finite(rate_per_second))
      throw std::invalid_argument(std::string(who) +
                                  ": rate_per_second must be positive and finite");
    if (burst == 0) throw std::invalid_argument(std::string(who) + ": burst must be at least 1");
    const double ns = detail::round(1e9 / rate_per_second);
    if (ns < 1.0)
      throw std::invalid_argument(std::string(who) +
                                  ": rate_per_second above 1e9 (one token per nanosecond)");
    if (ns * static_cast<double>(burst) > 1e18)
      throw std::invalid_argument(std::string(who) + ": burst / rate_per_second is too long");
    interval_ = clock::duration(static_cast<clock::duration::rep>(ns));
  }

  void check(std::size_t n, const char* who) const {
    if (n == 0 || n > burst_)
      throw std::invalid_argument(std::string(who) + ": acquire(n) needs 1 <= n <= burst (" +
                                  std::to_string(burst_) + "), got " + std::to_string(n) +
                                  "; a larger n could never be granted");
  }

  clock::time_point ready_at(std::size_t n, clock::time_point now) const {
    return std::max(now, tat_ - scaled(burst_ - n));
  }
  // Takes n tokens; returns the grant's key for give_back: the instant its
  // tokens end on the refill timeline (they refill over [key - n * interval,
  // key), after those taken before them).
  clock::time_point take(std::size_t n, clock::time_point now) {
    tat_ = std::max(tat_, now) + scaled(n);
    return tat_;
  }
  // Refunds what the grant with `key` took and has not refilled by `now`:
  // all of it at its grant instant, nothing once its tokens have refilled
  // (a give-back after the bucket refilled must not add tokens it never
  // lost). Exact when give-backs come in grant order or at the grant
  // instant; otherwise the error is bounded by the earlier refund.
  void give_back(std::size_t n, clock::time_point key, clock::time_point now) {
    const clock::duration left = key - std::max(key - scaled(n), now);
    if (left > clock::duration::zero()) tat_ -= left;
  }
  bool idle(clock::time_point now) const noexcept { return tat_ <= now; }
  [[nodiscard]] clock::time_point idle_at() const noexcept { return tat_; }

  // Tokens free at `now` (fractional while refilling). Exact whenever the
  // interval is (rates dividing 1e9): whole tokens are counted in integer
  // nanoseconds, only the part of a token refilling is a division.
  [[nodiscard]] double tokens(clock::time_point now) const noexcept {
    const auto debt = std::max(clock::duration::zero(), tat_ - now).count();
    const auto step = interval_.count();
    // burst_ * interval_ <= 1e18 (checked at construction): no narrowing.
    const auto whole = static_cast<clock::duration::rep>(burst_) - debt / step;
    return static_cast<double>(whole) -
           static_cast<double>(debt % step) / static_cast<double>(step);
  }
  [[nodiscard]] std::size_t burst() const noexcept { return burst_; }
  [[nodiscard]] clock::duration interval() const noexcept { return interval_; }

  // For stats(): the tokens taken and not refilled yet at `now` (a token
  // partly refilled counts as taken), and the burst.
  [[nodiscard]] std::size_t in_use(clock::time_point now) const noexcept {
    const double taken = detail::ceil(static_cast<double>(burst_) - tokens(now));
    return taken <= 0 ? 0 : static_cast<std::size_t>(taken);
  }
  [[nodiscard]] std::size_t limit() const noexcept { return burst_; }

 private:
  clock::duration scaled(std::size_t n) const noexcept {
    return interval_ * static_cast<clock::duration::rep>(n);
  }
  std::size_t burst_;
  clock::duration interval_{};
  clock::time_point tat_{};  // the epoch: full from the start
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_RATE_POLICY_HPP
