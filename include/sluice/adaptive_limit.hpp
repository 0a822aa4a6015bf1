// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_ADAPTIVE_LIMIT_HPP
#define SLUICE_ADAPTIVE_LIMIT_HPP

#include <sluice/adaptive_algorithms.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/adaptive_estimator.hpp>
#include <sluice/detail/permit_core.hpp>
#include <sluice/detail/virtual_clock.hpp>
#include <sluice/overloaded_error.hpp>
#include <sluice/retryable.hpp>
#include <sluice/stats.hpp>
#include <sluice/time.hpp>
#include <sluice/timeout.hpp>

#include <sluice/detail/asio.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
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
/// its waiters; permits must not outlive it. They may outlive the loop they
/// were granted on (a `testing::virtual_loop` per batch): the limit serves the
/// next loop, and a permit released later measures its latency to the time its
/// virtual loop ended at. Loop-affine, not thread-safe.
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
    /// Load shedding inside the wait (as `semaphore`'s constructor with
    /// `shed_options`): past `max_waiting` waiters `scoped_acquire()` throws
    /// `sluice::overloaded_error` at once; a wait reaching `max_wait` leaves
    /// with it. Counted in `stats().shed`; a shed call records no outcome.
    shed_options shed = {};
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
          now_(std::move(other.now_)),
          start_(other.start_),
          epoch_(other.epoch_),
          in_flight_(other.in_flight_) {}
    /// Releases what this owns, then takes over `other`'s place.
    permit& operator=(permit&& other) noexcept {
      if (this != &other) {
        reset();
        cap_ = std::exchange(other.cap_, nullptr);
        now_ = std::move(other.now_);
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
      const auto elapsed = read_clock() - start_;
      auto* c = std::exchange(cap_, nullptr);
      c->finish(o, sample{elapsed, epoch_, in_flight_});
    }
    /// Releases now without an outcome (no-op when empty).
    void reset() noexcept {
      if (auto* c = std::exchange(cap_, nullptr)) {
        c->core_.record_hold_duration(read_clock() - start_);
        c->release_one();
      }
    }

    /// The latency so far: from the grant to now, on the executor's clock
    /// (after a virtual loop was destroyed, to the time it ended at).
    [[nodiscard]] clock::duration elapsed() const {
      return cap_ ? read_clock() - start_ : clock::duration{};
    }

   private:
    friend class adaptive_limit;
    friend struct detail::budget_access;
    permit(adaptive_limit& c, const detail::virtual_clock_service* v)
        : cap_(&c),
          now_(v ? v->shared_now() : nullptr),
          start_(read_clock()),
          epoch_(c.estimate_.epoch()),
          in_flight_(c.in_flight()) {}

    // Through the clock's shared block, never its service: a permit that
    // outlived its virtual loop reads the time the loop ended at.
    [[nodiscard]] clock::time_point read_clock() const noexcept {
      return now_ ? now_->now() : clock::now();
    }

    adaptive_limit* cap_ = nullptr;
    std::shared_ptr<const detail::virtual_now> now_;  // null on the steady clock
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
  template <class = void>  // a template: compiled only in the TUs that call it (issue 32)
  [[nodiscard]] asio::awaitable<permit> scoped_acquire() {
    co_await core_.acquire([this] { release_one(); });
    const auto ex = co_await asio::this_coro::executor;
    co_return permit(*this, detail::find_virtual_clock(ex));
  }

  /// Takes a place if one is free and nobody waits; never suspends. The
  /// permit is empty otherwise. Latency is measured on `ex`'s clock.
  template <class Executor>
  [[nodiscard]] permit try_acquire(const Executor& ex) {
    if (!core_.try_acquire()) return {};
    return permit(*this, detail::find_virtual_clock(ex));
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
    estimate_.set(n);
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
    return clock::duration(static_cast<clock::duration::rep>(estimate_.baseline_ns()));
  }

 private:
  friend struct detail::budget_access;
  struct sample {
    clock::duration latency;
    std::uint64_t epoch;    // the limit's epoch at the grant
    std::size_t in_flight;  // permits held right after the grant
  };

  adaptive_limit(options o, asio::any_io_executor ex)
      : core_("sluice::adaptive_limit", check(o), false, std::move(ex), o.shed),
        min_(o.min),
        max_(o.max),
        limit_(o.initial),
        estimate_(o.initial, o.min, o.max, o.algorithm) {}

  static std::size_t check(const options& o) {
    auto fail = [](const std::string& what) {
      throw std::invalid_argument("sluice::adaptive_limit: " + what);
    };
    if (o.min < 1) fail("min must be >= 1");
    if (o.max < o.min) fail("max must be >= min");
    if (o.initial < o.min || o.initial > o.max) fail("initial must be in [min, max]");
    detail::adaptive_estimator::check(o.algorithm, fail);
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
        estimate_.on_success(static_cast<double>(s.latency.count()), s.in_flight, limit_);
        break;
      case outcome::throttled:
        ++throttles_;
        estimate_.on_pushback(s.epoch, limit_);
        break;
      case outcome::dropped:
        ++drops_;
        estimate_.on_pushback(s.epoch, limit_);
        break;
      case outcome::ignored:
        break;
    }
    apply();
    release_one();
  }

  // Moves the integer limit to the estimate's: new places go to the
  // waiters; removed ones are taken from the pool or absorbed later. In one
  // step (a limit of 2^62 is set as fast as one of 8), and counting no grant
  // for the places that leave the pool.
  void apply() {
    const std::size_t target = estimate_.target();
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
  std::size_t limit_;                    // the integer limit: estimate_.target() after each event
  std::size_t debt_ = 0;                 // places to absorb on release (in flight above the limit)
  detail::adaptive_estimator estimate_;  // the continuous limit the algorithm moves
  std::size_t successes_ = 0, throttles_ = 0, drops_ = 0;
};

}  // namespace sluice

#endif  // SLUICE_ADAPTIVE_LIMIT_HPP
