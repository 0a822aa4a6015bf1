// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_ADAPTIVE_LIMIT_HPP
#define SLUICE_ADAPTIVE_LIMIT_HPP

#include <sluice/config.hpp>
#include <sluice/detail/permit_core.hpp>
#include <sluice/retryable.hpp>
#include <sluice/stats.hpp>
#include <sluice/time.hpp>
#include <sluice/timeout.hpp>

#include <sluice/detail/asio.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>

namespace sluice {

namespace detail {
struct budget_access;  // sluice::acquire_all's way in (detail/all_budgets.hpp)
}  // namespace detail

/// Additive increase, multiplicative decrease (TCP's congestion control, as in
/// Netflix's concurrency-limits `AIMDLimit`): while the limit is in use, each
/// round of `limit` successful calls adds `increase`; a throttle or a drop
/// multiplies the limit by `backoff`. After a throttle the limit stays below
/// the level that was throttled for `hold` successful calls before it probes
/// that level again, so a provider whose capacity stays put sees about one
/// throttle per `hold` calls (the plain sawtooth costs one per ~limit² / 2).
struct aimd {
  double increase = 1.0;   ///< added per round of `limit` successes (>= 0)
  double backoff = 0.9;    ///< the limit's factor on a throttle or a drop, in (0, 1]
  std::size_t hold = 200;  ///< successes below a throttled level before probing it again
};

/// Latency-based (after Netflix's Gradient / Gradient2): the limit falls as
/// soon as the mean latency of a round rises above `tolerance` times the
/// no-load baseline (the lowest latency seen in the last one or two
/// `baseline_window` samples), by the gradient `tolerance · baseline /
/// latency` (at most halving it), and otherwise grows by `increase` per
/// round; throttles and drops act as in `aimd`. It trades a little
/// throughput for latency: the limit settles where the provider's latency is
/// `tolerance` times its idle latency, usually before any 429. Under steady
/// load at capacity for longer than the window, the baseline converges to the
/// loaded latency and the limit then probes by throttles, as `aimd` does.
struct gradient {
  double tolerance = 2.0;  ///< latency / baseline above which the limit falls (> 1)
  double increase = 1.0;   ///< added per round while the latency is within tolerance
  double backoff = 0.9;    ///< the limit's factor on a throttle or a drop, in (0, 1]
  std::size_t hold = 200;  ///< successes below a throttled level before probing it again
  std::size_t baseline_window = 10000;  ///< samples the baseline remembers (1 to 2 windows)
};

/// Queue-based (after TCP Vegas and Netflix's `VegasLimit`): once per round
/// the calls queued at the provider are estimated as `limit · (1 − baseline /
/// latency)`; the limit grows by one while that is below `alpha`, falls by one
/// above `beta`; throttles and drops act as in `aimd`.
struct vegas {
  double alpha = 3.0;      ///< queued calls under which the limit grows
  double beta = 6.0;       ///< queued calls above which the limit falls (>= alpha)
  double backoff = 0.9;    ///< the limit's factor on a throttle or a drop, in (0, 1]
  std::size_t hold = 200;  ///< successes below a throttled level before probing it again
  std::size_t baseline_window = 10000;  ///< samples the baseline remembers (1 to 2 windows)
};

/// A semaphore whose limit follows the provider (Netflix's concurrency-limits;
/// tower's and Envoy's adaptive concurrency): callers report how each call
/// went, and the limit grows while calls succeed and falls on a throttle, a
/// timeout, or (`gradient`, `vegas`) rising latency. Nobody has to know the
/// provider's capacity in advance, and it may change under load.
///
/// Each permit measures its call's latency on the clock of the acquiring
/// coroutine's executor (virtual under `testing::virtual_loop`), from the grant
/// to the outcome: `p.succeeded()`, `p.throttled()` (HTTP 429, a quota error)
/// or `p.dropped()` (a timeout, a dropped connection). A permit released
/// without an outcome (destroyed, `reset()`, an unrelated error) returns its
/// place and teaches the algorithm nothing. `run(fn)` reports for you.
///
/// The limit stays in [`min`, `max`]. Lowering it below what is in flight
/// revokes nothing: the surplus permits are absorbed as they are released, and
/// no waiter is granted until in-flight calls are below the new limit. Raising
/// it hands the new places to the oldest waiters at once.
///
/// Waiting is exactly `semaphore`'s (the same core): FIFO hand-off without
/// barging, each waiter resumed through a post to its own executor, and
/// cancellation that never loses a permit (a waiter is either removed holding
/// nothing, or was granted and, if cancelled before it resumed, passes the
/// permit on and throws `operation_aborted`), also for a caller whose
/// cancellation was requested before it called. Destroying the limit aborts
/// its waiters; permits must not outlive it. Loop-affine, not thread-safe.
///
/// @code
/// sluice::adaptive_limit cap{{.initial = 4, .min = 1, .max = 64, .algorithm = sluice::aimd{}}};
/// auto call = [&](request r) -> asio::awaitable<reply> {
///   // a sluice::throttled_error (or an error with a retry_after hint) lowers the limit
///   co_return co_await cap.run([&] { return client.send(r); });
/// };
/// metrics.gauge("limit", cap.limit()); metrics.gauge("in_flight", cap.in_flight());
/// @endcode
class adaptive_limit {
 public:
  /// How a call went, as `run`'s classifier reports it.
  enum class outcome {
    succeeded,  ///< the call worked: the limit may grow
    throttled,  ///< the provider refused it (HTTP 429, a quota): the limit falls
    dropped,    ///< it timed out or was dropped: the limit falls
    ignored     ///< says nothing about capacity (another error, cancellation)
  };

  /// The settings; designated initializers: `{.initial = 4, .min = 1, .max = 64}`.
  struct options {
    std::size_t initial = 4;  ///< the limit before any feedback
    std::size_t min = 1;      ///< the limit never falls below this (>= 1)
    std::size_t max = 64;     ///< the limit never rises above this
    std::variant<aimd, gradient, vegas> algorithm = aimd{};  ///< how the limit moves
  };

  /// Move-only ownership of one place; reports the call's outcome and
  /// releases. Destroying it (or `reset()`) releases without an outcome.
  class permit {
   public:
    /// An empty permit that owns nothing.
    permit() noexcept = default;
    /// Takes over `other`'s place; `other` is left empty.
    permit(permit&& other) noexcept
        : cap_(std::exchange(other.cap_, nullptr)),
          vclock_(other.vclock_),
          start_(other.start_),
          epoch_(other.epoch_),
          in_flight_(other.in_flight_) {}
    /// Releases what this owns, then takes over `other`'s place.
    permit& operator=(permit&& other) noexcept {
      if (this != &other) {
        reset();
        cap_ = std::exchange(other.cap_, nullptr);
        vclock_ = other.vclock_;
        start_ = other.start_;
        epoch_ = other.epoch_;
        in_flight_ = other.in_flight_;
      }
      return *this;
    }
    ~permit() { reset(); }

    /// True while it owns a place.
    explicit operator bool() const noexcept { return cap_ != nullptr; }

    /// The call succeeded: feeds its latency to the algorithm and releases.
    /// No-op when empty.
    void succeeded() { report(outcome::succeeded); }
    /// The provider refused the call (a throttle): the limit falls; releases.
    void throttled() { report(outcome::throttled); }
    /// The call timed out or was dropped: the limit falls; releases.
    void dropped() { report(outcome::dropped); }
    /// Reports `o` (`ignored` releases without feedback).
    void report(outcome o) {
      if (cap_ == nullptr) return;
      const auto elapsed = (vclock_ ? vclock_->now() : clock::now()) - start_;
      auto* c = std::exchange(cap_, nullptr);
      c->finish(o, sample{elapsed, epoch_, in_flight_});
    }
    /// Releases now without an outcome (no-op when empty).
    void reset() noexcept {
      if (auto* c = std::exchange(cap_, nullptr)) {
        c->core_.record_hold_duration((vclock_ ? vclock_->now() : clock::now()) - start_);
        c->release_one();
      }
    }

    /// The latency so far: from the grant to now, on the executor's clock.
    [[nodiscard]] clock::duration elapsed() const {
      return cap_ ? (vclock_ ? vclock_->now() : clock::now()) - start_ : clock::duration{};
    }

   private:
    friend class adaptive_limit;
    friend struct detail::budget_access;
    permit(adaptive_limit& c, detail::virtual_clock_service* v, clock::time_point start)
        : cap_(&c), vclock_(v), start_(start), epoch_(c.epoch_), in_flight_(c.in_flight()) {}

    adaptive_limit* cap_ = nullptr;
    detail::virtual_clock_service* vclock_ = nullptr;
    clock::time_point start_{};
    std::uint64_t epoch_ = 0;
    std::size_t in_flight_ = 0;
  };

  /// An adaptive limit with no executor. Throws `std::invalid_argument` unless
  /// 1 <= min <= initial <= max and the algorithm's parameters are in range.
  explicit adaptive_limit(options o) : adaptive_limit(std::move(o), asio::any_io_executor{}) {}

  /// As above, with an executor for handlers that have none of their own.
  template <class Executor>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      adaptive_limit(const Executor& ex, options o)
      : adaptive_limit(std::move(o), asio::any_io_executor(ex)) {}

  adaptive_limit(const adaptive_limit&) = delete;
  adaptive_limit& operator=(const adaptive_limit&) = delete;

  /// Waits for a place under the current limit; the permit measures latency
  /// from the grant. Does not suspend when a place is free and nobody waits.
  /// Throws `system_error(operation_aborted)` when cancelled (holding nothing).
  [[nodiscard]] asio::awaitable<permit> scoped_acquire() {
    co_await core_.acquire([this] { release_one(); });
    auto ex = co_await asio::this_coro::executor;
    auto* v = detail::find_virtual_clock(ex);
    co_return permit(*this, v, v ? v->now() : clock::now());
  }

  /// Takes a place if one is free and nobody waits; never suspends. The
  /// permit is empty otherwise. Latency is measured on `ex`'s clock.
  template <class Executor>
  [[nodiscard]] permit try_acquire(const Executor& ex) {
    if (!core_.try_acquire()) return {};
    auto* v = detail::find_virtual_clock(ex);
    return permit(*this, v, v ? v->now() : clock::now());
  }

  /// Runs `fn()` (which returns an awaitable) under a permit and reports its
  /// outcome: success; `classify(exception)` for an exception, which is then
  /// rethrown unchanged. The permit is released on every way out, also when
  /// the caller is cancelled (as `ignored` then). A `classify` that throws
  /// reports nothing (`ignored`) and ends the call with
  /// `sluice::callback_error`, the call's own error nested in it.
  template <class F, class Classify>
  [[nodiscard]] auto run(F fn, Classify classify)
      -> asio::awaitable<typename std::invoke_result_t<F&>::value_type> {
    using T = typename std::invoke_result_t<F&>::value_type;
    auto p = co_await scoped_acquire();
    std::exception_ptr error;
    try {
      if constexpr (std::is_void_v<T>) {
        co_await fn();
        p.succeeded();
        co_return;
      } else {
        T r = co_await fn();
        p.succeeded();
        co_return r;
      }
    } catch (...) {
      error = std::current_exception();
    }
    outcome o = outcome::ignored;
    try {
      o = classify(error);
    } catch (...) {
      detail::throw_callback_failure("sluice::adaptive_limit::run: classify", error);
    }
    p.report(o);
    std::rethrow_exception(error);
  }

  /// As above with `default_classify`.
  template <class F>
  [[nodiscard]] auto run(F fn) {
    return run(std::move(fn), &adaptive_limit::default_classify);
  }

  /// The default classifier of `run`: a timeout (`sluice::timeout_error`, a
  /// `system_error` of `timed_out`) is `dropped`; any other
  /// `sluice::retryable` error (`sluice::throttled_error`, an error carrying a
  /// `sluice::retry_after` hint, as `testing::slow_service`'s throttles do) is
  /// `throttled`; the rest (`operation_aborted` included) `ignored`.
  static outcome default_classify(const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const timeout_error&) {
      return outcome::dropped;
    } catch (const system_error& s) {
      if (s.code() == asio::error::timed_out) return outcome::dropped;
    } catch (...) {
    }
    return retryable(e) ? outcome::throttled : outcome::ignored;
  }

  /// Sets the limit by hand (clamped to [min, max]), e.g. from a quota the
  /// provider announced; the algorithm continues from there.
  void set_limit(std::size_t n) {
    estimate_ = static_cast<double>(std::clamp(n, min_, max_));
    apply();
  }

  /// The limit now: at most this many permits are granted at once.
  [[nodiscard]] std::size_t limit() const noexcept { return limit_; }
  /// Permits held now (granted and not yet released); may exceed `limit()`
  /// right after it fell.
  [[nodiscard]] std::size_t in_flight() const noexcept { return limit_ + debt_ - core_.value(); }
  /// Operations waiting for a permit now.
  [[nodiscard]] std::size_t waiters() const noexcept { return core_.waiters(); }
  /// The most operations that ever waited at once (high-water mark).
  [[nodiscard]] std::size_t max_waiters() const noexcept { return core_.max_waiters(); }
  /// The limit never falls below this.
  [[nodiscard]] std::size_t min() const noexcept { return min_; }
  /// The limit never rises above this.
  [[nodiscard]] std::size_t max() const noexcept { return max_; }
  /// Calls reported `succeeded` so far.
  [[nodiscard]] std::size_t successes() const noexcept { return successes_; }
  /// Calls reported `throttled` so far.
  [[nodiscard]] std::size_t throttles() const noexcept { return throttles_; }
  /// Calls reported `dropped` so far.
  [[nodiscard]] std::size_t drops() const noexcept { return drops_; }
  /// What the limit has done and is doing (see `sluice::stats`): grants,
  /// cancelled waits, waiting now, the wait of every grant and the hold of
  /// every permit (its measured latency); `in_use` is `in_flight()`, `limit`
  /// the current `limit()`, `throttled` the calls reported `throttled`
  /// (`throttles()`). O(buckets), allocates nothing.
  [[nodiscard]] sluice::stats stats() const noexcept {
    sluice::stats s = core_.stats();
    s.in_use = in_flight();
    s.limit = limit_;
    s.throttled = throttles_;
    return s;
  }
  /// The no-load latency baseline (`gradient`, `vegas`; zero before a sample).
  [[nodiscard]] clock::duration baseline() const noexcept {
    return clock::duration(static_cast<clock::duration::rep>(baseline_ns()));
  }

 private:
  friend struct detail::budget_access;
  struct sample {
    clock::duration latency;
    std::uint64_t epoch;    // the limit's epoch at the grant
    std::size_t in_flight;  // permits held right after the grant
  };

  adaptive_limit(options o, asio::any_io_executor ex)
      : core_("sluice::adaptive_limit", check(o), false, std::move(ex)),
        min_(o.min),
        max_(o.max),
        limit_(o.initial),
        estimate_(static_cast<double>(o.initial)),
        algorithm_(o.algorithm) {}

  static std::size_t check(const options& o) {
    auto fail = [](const std::string& what) {
      throw std::invalid_argument("sluice::adaptive_limit: " + what);
    };
    if (o.min < 1) fail("min must be >= 1");
    if (o.max < o.min) fail("max must be >= min");
    if (o.initial < o.min || o.initial > o.max) fail("initial must be in [min, max]");
    std::visit(
        [&](const auto& a) {
          if (!(a.backoff > 0.0 && a.backoff <= 1.0)) fail("backoff must be in (0, 1]");
          using A = std::decay_t<decltype(a)>;
          if constexpr (std::is_same_v<A, vegas>) {
            if (!(a.alpha >= 0.0 && a.beta >= a.alpha)) fail("vegas needs 0 <= alpha <= beta");
          } else if (!(a.increase >= 0.0)) {
            fail("increase must be >= 0");
          }
          if constexpr (std::is_same_v<A, gradient>) {
            if (!(a.tolerance > 1.0)) fail("gradient tolerance must be > 1");
          }
          if constexpr (!std::is_same_v<A, aimd>) {
            if (a.baseline_window < 1) fail("baseline_window must be >= 1");
          }
        },
        o.algorithm);
    return o.initial;
  }

  // Returns one place: absorbed while the limit is below what is in flight,
  // else handed to the oldest waiter or back to the pool.
  void release_one() noexcept {
    if (debt_ > 0) {
      --debt_;
      return;
    }
    core_.release("");
  }

  // The algorithm moves the limit first, so that a place freed by a throttle
  // is absorbed by the decrease instead of going to the next waiter.
  void finish(outcome o, const sample& s) {
    core_.record_hold_duration(s.latency);
    switch (o) {
      case outcome::succeeded:
        ++successes_;
        on_success(s);
        break;
      case outcome::throttled:
        ++throttles_;
        on_pushback(s);
        break;
      case outcome::dropped:
        ++drops_;
        on_pushback(s);
        break;
      case outcome::ignored:
        break;
    }
    release_one();
  }

  // A throttle or a drop: one multiplicative decrease per congestion event
  // (a permit granted before the last decrease reports the same event).
  void on_pushback(const sample& s) {
    if (s.epoch != epoch_) return;
    ceiling_ = static_cast<double>(limit_);
    std::visit([this](const auto& a) { estimate_ *= a.backoff; }, algorithm_);
    hold_left_ = std::visit([](const auto& a) { return a.hold; }, algorithm_);
    round_count_ = 0;
    round_sum_ = 0.0;
    ++epoch_;
    apply();
  }

  void on_success(const sample& s) {
    const double latency = static_cast<double>(s.latency.count());
    std::visit(
        [&](const auto& a) {
          using A = std::decay_t<decltype(a)>;
          const bool saturated = 2 * s.in_flight >= limit_;
          if constexpr (std::is_same_v<A, aimd>) {
            if (saturated) grow(a.increase / estimate_);
          } else {
            observe_baseline(latency, a.baseline_window);
            round_sum_ += latency;
            if (++round_count_ < limit_) return;
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
    apply();
  }

  // A latency-driven decrease: a congestion event of its own.
  void shrink(double factor) {
    estimate_ *= factor;
    ++epoch_;
    apply();
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

  [[nodiscard]] double baseline_ns() const noexcept {
    if (previous_min_ <= 0.0) return current_min_;
    if (current_min_ <= 0.0) return previous_min_;
    return std::min(previous_min_, current_min_);
  }

  // Clamps the estimate and moves the integer limit to it: new places go to
  // the waiters; removed ones are taken from the pool or absorbed later.
  // In one step (a limit of 2^62 is set as fast as one of 8), and counting no
  // grant for the places that leave the pool.
  void apply() {
    estimate_ = std::clamp(estimate_, static_cast<double>(min_), static_cast<double>(max_));
    // Compared as doubles first: a max near 2^64 rounds up to 2^64, which
    // does not convert back to std::size_t.
    const std::size_t target =
        std::floor(estimate_) >= static_cast<double>(max_)
            ? max_
            : std::clamp(static_cast<std::size_t>(std::floor(estimate_)), min_, max_);
    if (limit_ < target) {
      std::size_t up = target - limit_;
      limit_ = target;
      const std::size_t absorbed = std::min(up, debt_);  // in flight above the old limit
      debt_ -= absorbed;
      up -= absorbed;
      core_.deposit(up);
    } else if (limit_ > target) {
      const std::size_t down = limit_ - target;
      limit_ = target;
      debt_ += down - core_.withdraw(down);
    }
  }

  detail::permit_core core_;
  std::size_t min_, max_;
  std::size_t limit_;     // the integer limit: floor(estimate_) in [min_, max_]
  std::size_t debt_ = 0;  // places to absorb on release (in flight above the limit)
  double estimate_;       // the continuous limit the algorithm moves
  std::variant<aimd, gradient, vegas> algorithm_;
  std::uint64_t epoch_ = 0;                                   // bumped by each decrease
  double ceiling_ = std::numeric_limits<double>::infinity();  // the last throttled level
  std::size_t hold_left_ = 0;  // successes still to wait at the ceiling
  std::size_t round_count_ = 0;
  double round_sum_ = 0.0;
  double current_min_ = 0.0, previous_min_ = 0.0;
  std::size_t window_count_ = 0;
  std::size_t successes_ = 0, throttles_ = 0, drops_ = 0;
};

}  // namespace sluice

#endif  // SLUICE_ADAPTIVE_LIMIT_HPP
