// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_BREAKER_HPP
#define SLUICE_BREAKER_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/overloaded_error.hpp>
#include <sluice/retryable.hpp>
#include <sluice/time.hpp>
#include <sluice/timeout.hpp>

#include <sluice/detail/asio.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace sluice {

/// The state of a `sluice::circuit_breaker`.
enum class breaker_state {
  closed,     ///< calls pass; outcomes are recorded in the window
  open,       ///< calls fail at once with `breaker_open_error` until `open_for` passed
  half_open,  ///< `half_open_calls` trial calls pass; their outcome closes or reopens
};

/// "closed", "open" or "half_open".
[[nodiscard]] constexpr const char* to_string(breaker_state s) noexcept {
  return s == breaker_state::closed ? "closed" : s == breaker_state::open ? "open" : "half_open";
}

/// Thrown at once by an open `sluice::circuit_breaker` (and by a half-open
/// one whose trial calls are all taken): the call did not run. Not
/// `sluice::retryable` by default (retrying into an open breaker only adds
/// load); `retry_in()` says when the next trial call will pass.
class breaker_open_error : public std::runtime_error {
 public:
  /// `retry_in`: time until the breaker lets a trial call through (zero while
  /// the trial calls of the half-open state run); any duration, saturated.
  explicit breaker_open_error(saturating_duration retry_in)
      : std::runtime_error(
            detail::seconds_message("sluice: circuit breaker open; next trial in", retry_in)),
        retry_in_(retry_in) {}
  /// Time until the next trial call passes, as of the refusal.
  [[nodiscard]] clock::duration retry_in() const noexcept { return retry_in_; }

 private:
  clock::duration retry_in_;
};

/// The configuration of a `sluice::circuit_breaker` (resilience4j's model);
/// designated initializers: `{.failure_rate = 0.5, .window = 20, .open_for = 10s}`.
struct breaker_options {
  /// Opens when failed calls / calls in the window reach it (in (0, 1]).
  double failure_rate = 0.5;
  /// Opens when slow calls / calls in the window reach it (in (0, 1]).
  double slow_call_rate = 1.0;
  /// A call that takes longer than this is slow (max(): none is).
  clock::duration slow_call = clock::duration::max();
  /// The window: the last `window` calls (a count window) ...
  std::size_t window = 100;
  /// ... or, when positive, the calls that ended in the last `window_time`
  /// (a time window; `window` is then ignored).
  clock::duration window_time = clock::duration::zero();
  /// With fewer calls in the window the breaker never opens.
  std::size_t minimum_calls = 10;
  /// How long the breaker stays open before it lets trial calls through.
  clock::duration open_for = std::chrono::seconds(60);
  /// Trial calls in the half-open state; when all have ended, their failure
  /// and slow rates (same thresholds) reopen the breaker or close it.
  std::size_t half_open_calls = 1;
  /// Which exceptions count as failures (a call that throws another one
  /// counts as a success). Empty: every exception except
  /// `sluice::overloaded_error` (a shed inside the breaker is the client's own
  /// refusal, not the provider's failure). A call ended by `operation_aborted`
  /// is never recorded. If it throws, the call is not recorded (a half-open
  /// trial gives its place back) and ends with `sluice::callback_error`
  /// carrying that exception, the call's own error nested in it.
  std::function<bool(const std::exception_ptr&)> is_failure = nullptr;
  /// Called on every state change with (from, to), after the breaker's lock
  /// is released, on the thread of the call that caused it. Must not throw.
  std::function<void(breaker_state, breaker_state)> on_state_change = nullptr;
};

/// What a `sluice::circuit_breaker` has done (counts since construction) and
/// its window now.
struct breaker_stats {
  breaker_state state = breaker_state::closed;  ///< the state now
  std::uint64_t calls = 0;                      ///< calls that ran and ended (not cancelled)
  std::uint64_t failures = 0;                   ///< of them, failed
  std::uint64_t slow = 0;                       ///< of them, slow
  std::uint64_t not_permitted = 0;              ///< calls refused with `breaker_open_error`
  std::uint64_t opened = 0;                     ///< transitions to open
  std::size_t window_calls = 0;                 ///< calls in the window now (closed state)
  std::size_t window_failures = 0;              ///< failed calls in the window now
  std::size_t window_slow = 0;                  ///< slow calls in the window now
};

namespace detail {

// The breaker's state machine, under one mutex. A call is admitted with the
// generation of the state it entered; its outcome counts only in that same
// generation (a call that began before the breaker opened is not a trial).
class breaker_core {
 public:
  struct ticket {
    std::uint64_t generation;
    bool trial;
  };
  using change = std::pair<breaker_state, breaker_state>;

  // Throws std::invalid_argument for options out of range.
  SLUICE_DECL explicit breaker_core(breaker_options o);

  // Admits a call at `now` or throws breaker_open_error.
  ticket admit(clock::time_point now) {
    std::unique_lock lock(mutex_);
    change c{state_, state_};
    if (state_ == breaker_state::open) {
      if (now - opened_at_ < opt_.open_for) {
        ++stats_.not_permitted;
        throw breaker_open_error(opt_.open_for - (now - opened_at_));
      }
      c = move_to(breaker_state::half_open, now);
    }
    const bool refused =
        state_ == breaker_state::half_open && trials_started_ >= opt_.half_open_calls;
    const ticket t{generation_, state_ == breaker_state::half_open};
    if (refused) {
      ++stats_.not_permitted;
    } else if (t.trial) {
      ++trials_started_;
    }
    lock.unlock();
    notify(c);
    if (refused) throw breaker_open_error(clock::duration::zero());
    return t;
  }

  // Records the outcome of an admitted call that ended at `now`.
  void record(ticket t, bool failed, bool slow, clock::time_point now) {
    std::unique_lock lock(mutex_);
    ++stats_.calls;
    stats_.failures += failed;
    stats_.slow += slow;
    if (t.generation != generation_) return;  // admitted in a state that has ended
    change c{state_, state_};
    if (state_ == breaker_state::closed) {
      push(failed, slow, now);
      expire(now);
      if (window_calls_ >= opt_.minimum_calls &&
          over(window_failures_, window_slow_, window_calls_))
        c = move_to(breaker_state::open, now);
    } else if (state_ == breaker_state::half_open) {
      ++trials_done_;
      trial_failures_ += failed;
      trial_slow_ += slow;
      if (trials_done_ == opt_.half_open_calls)
        c = move_to(over(trial_failures_, trial_slow_, trials_done_) ? breaker_state::open
                                                                     : breaker_state::closed,
                    now);
    }
    lock.unlock();
    notify(c);
  }

  // A call admitted with `t` was cancelled: a trial gives its place back.
  void cancelled(ticket t) noexcept {
    std::lock_guard lock(mutex_);
    if (t.trial && t.generation == generation_ && state_ == breaker_state::half_open)
      --trials_started_;
  }

  [[nodiscard]] SLUICE_DECL breaker_stats stats(clock::time_point now);

  [[nodiscard]] const breaker_options& options() const noexcept { return opt_; }

 private:
  struct entry {
    clock::time_point at;
    bool failed, slow;
  };

  bool over(std::size_t failures, std::size_t slow, std::size_t calls) const noexcept {
    const double n = static_cast<double>(calls);
    constexpr double eps = 1e-9;  // 0.3 * 10 is 3.0000000000000004
    return static_cast<double>(failures) >= opt_.failure_rate * n - eps ||
           static_cast<double>(slow) >= opt_.slow_call_rate * n - eps;
  }
  void push(bool failed, bool slow, clock::time_point now) {
    window_.push_back({now, failed, slow});
    ++window_calls_;
    window_failures_ += failed;
    window_slow_ += slow;
    if (opt_.window_time <= clock::duration::zero() && window_.size() > opt_.window) pop();
  }
  void pop() {
    window_failures_ -= window_.front().failed;
    window_slow_ -= window_.front().slow;
    --window_calls_;
    window_.pop_front();
  }
  void expire(clock::time_point now) {
    if (opt_.window_time <= clock::duration::zero() || now == clock::time_point::min()) return;
    while (!window_.empty() && now - window_.front().at >= opt_.window_time) pop();
  }
  // A transition (cold: the window starts empty).
  SLUICE_DECL change move_to(breaker_state to, clock::time_point now);
  void notify(change c) const noexcept {
    if (c.first != c.second && opt_.on_state_change) opt_.on_state_change(c.first, c.second);
  }

  breaker_options opt_;
  std::mutex mutex_;
  breaker_state state_ = breaker_state::closed;
  std::uint64_t generation_ = 0;
  clock::time_point opened_at_{};
  std::deque<entry> window_;
  std::size_t window_calls_ = 0, window_failures_ = 0, window_slow_ = 0;
  std::size_t trials_started_ = 0, trials_done_ = 0, trial_failures_ = 0, trial_slow_ = 0;
  breaker_stats stats_;
};

}  // namespace detail

/// A circuit breaker as a policy layer (resilience4j's CircuitBreaker):
/// closed, it lets calls through and records their outcomes in a window;
/// when, with at least `minimum_calls` in the window, the failure rate or the
/// slow-call rate reaches its threshold, it opens; open, every call fails at
/// once with `sluice::breaker_open_error` (holding the time to the next
/// trial) until `open_for` has passed since it opened; then it is half-open
/// and lets `half_open_calls` trial calls through (more fail at once); when
/// all have ended, it reopens if their rates reach a threshold, else closes
/// with an empty window.
///
/// - Time is the caller's executor's clock (virtual, and exact, under
///   `sluice::testing::virtual_loop`); a call's duration is from its
///   admission to its end, and a call is slow when longer than `slow_call`.
/// - What fails: see `breaker_options::is_failure` (by default every
///   exception but a shed, `overloaded_error`, from a layer inside).
/// - Only the outcomes of calls admitted in the current state count: a call
///   that began before the breaker opened is not a trial.
/// - Per-Operation Cancellation: a call ended by `operation_aborted` is not
///   recorded (a trial gives its place back); the exception passes through.
/// - Thread-safe (one mutex): one breaker may be shared by every thread of a
///   server; `on_state_change` runs outside the lock.
/// - Throws `std::invalid_argument` at construction for a rate outside
///   (0, 1], an empty window, `half_open_calls == 0` or a negative duration.
///
/// @code
/// auto p = sluice::policy(sluice::breaker({.failure_rate = 0.5, .window = 20,
///                                          .minimum_calls = 10, .open_for = 30s}));
/// try {
///   co_await p([&] { return call_backend(req); });
/// } catch (const sluice::breaker_open_error& e) {
///   reply_503(e.retry_in());
/// }
/// @endcode
class circuit_breaker {
 public:
  /// A closed breaker with configuration `o`.
  explicit circuit_breaker(breaker_options o)
      : core_(std::make_unique<detail::breaker_core>(std::move(o))) {}

  /// Admits the call (or throws `breaker_open_error`), awaits `next()` and
  /// records its outcome.
  template <class Next>
  auto call(Next next) -> std::invoke_result_t<Next&> {
    using T = task_result_t<std::invoke_result_t<Next&>>;
    const auto ex = co_await asio::this_coro::executor;
    const clock::time_point start = sluice::now(ex);
    const detail::breaker_core::ticket t = core_->admit(start);
    std::exception_ptr error;
    try {
      if constexpr (std::is_void_v<T>) {
        co_await next();
        finish(t, start, sluice::now(ex), false);
        co_return;
      } else {
        T v = co_await next();
        finish(t, start, sluice::now(ex), false);
        co_return v;
      }
    } catch (...) {
      error = std::current_exception();
    }
    const auto& is_failure = core_->options().is_failure;
    if (detail::is_operation_aborted(error)) {
      core_->cancelled(t);
      std::rethrow_exception(error);
    }
    bool failed = false;
    try {
      failed = is_failure ? is_failure(error) : !is_overload(error);
    } catch (...) {
      core_->cancelled(t);  // not recorded: a trial gives its place back
      detail::throw_callback_failure("sluice::breaker: is_failure", error);
    }
    finish(t, start, sluice::now(ex), failed);
    std::rethrow_exception(error);
  }

  /// The state now.
  [[nodiscard]] breaker_state state() { return core_->stats(clock::time_point::min()).state; }
  /// Counts and the window as of `now` (for a time window, entries older
  /// than `window_time` before `now` are dropped first).
  [[nodiscard]] breaker_stats stats(clock::time_point now = clock::time_point::min()) {
    return core_->stats(now);
  }
  /// The configuration.
  [[nodiscard]] const breaker_options& options() const noexcept { return core_->options(); }

 private:
  static bool is_overload(const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const overloaded_error&) {
      return true;
    } catch (...) {
      return false;
    }
  }
  void finish(detail::breaker_core::ticket t, clock::time_point start, clock::time_point end,
              bool failed) {
    core_->record(t, failed, end - start > core_->options().slow_call, end);
  }
  std::unique_ptr<detail::breaker_core> core_;
};

/// A `circuit_breaker` layer with configuration `o`.
[[nodiscard]] inline circuit_breaker breaker(breaker_options o) {
  return circuit_breaker(std::move(o));
}

}  // namespace sluice

#if SLUICE_HEADER_DEFS
#include <sluice/impl/breaker.ipp>
#endif

#endif  // SLUICE_BREAKER_HPP
