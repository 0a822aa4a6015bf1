// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_HEDGE_HPP
#define SLUICE_HEDGE_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/gather.hpp>
#include <sluice/time.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/child_set.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace sluice {

/// The configuration of a `sluice::hedge` layer; designated initializers:
/// `{.quantile = 0.95, .budget = 0.05}` or `{.after = 50ms}`.
struct hedge_options {
  /// The hedge's delay before `min_samples` latencies are known, or always
  /// when `quantile` is 0 (`clock::duration::max()`: no hedge then).
  clock::duration after = clock::duration::max();
  /// When positive, the delay is this quantile of the latencies of the last
  /// `window` successful calls, from each call's start to its first success
  /// (hedges included; "The Tail at Scale": 0.95).
  double quantile = 0.0;
  /// Hedges stay at or below `budget` times the calls so far (0.05: at most
  /// 5% extra attempts).
  double budget = 0.05;
  std::size_t window = 1000;      ///< latencies kept for the quantile
  std::size_t min_samples = 100;  ///< latencies needed before the quantile is used
};

/// What a `sluice::hedge` layer has done, counted since its construction.
struct hedge_stats {
  std::uint64_t calls = 0;        ///< calls through the layer
  std::uint64_t hedged = 0;       ///< second attempts started
  std::uint64_t hedge_won = 0;    ///< calls the second attempt won
  std::uint64_t over_budget = 0;  ///< hedges not started because the budget was spent
  clock::duration delay{};        ///< the delay the next call would use
};

namespace detail {

// The latencies and counts of one hedge layer, under one mutex.
class hedge_core {
 public:
  SLUICE_DECL explicit hedge_core(hedge_options o);
  clock::duration begin() {
    std::lock_guard lock(mutex_);
    ++stats_.calls;
    return delay_locked();
  }
  bool try_hedge() {
    std::lock_guard lock(mutex_);
    if (static_cast<double>(stats_.hedged + 1) >
        opt_.budget * static_cast<double>(stats_.calls) + 1e-9) {
      ++stats_.over_budget;
      return false;
    }
    ++stats_.hedged;
    return true;
  }
  void succeeded(clock::duration latency, bool hedge_won) {
    std::lock_guard lock(mutex_);
    stats_.hedge_won += hedge_won;
    if (samples_.size() < opt_.window) {
      samples_.push_back(latency);
    } else {
      samples_[next_] = latency;
      next_ = (next_ + 1) % opt_.window;
    }
  }
  SLUICE_DECL hedge_stats stats();

 private:
  // The quantile of the samples (the delay of a call starting now).
  SLUICE_DECL clock::duration delay_locked();

  hedge_options opt_;
  std::mutex mutex_;
  std::vector<clock::duration> samples_, sorted_;
  std::size_t next_ = 0;
  hedge_stats stats_;
};

// One hedged call: attempt 0 is child 0, the hedge's timer child 1, the hedge
// (attempt 1) child 2 once started. Invariant: `won` is set once, by the first
// attempt that succeeded; every other child is then cancelled.
template <class T>
struct hedge_race {
  std::shared_ptr<child_set> children = child_set::make();
  std::optional<gather_value_t<T>> value;
  std::exception_ptr error[2];
  bool done[2] = {false, false};
  bool hedge_started = false;
  bool won = false;
  clock::time_point start;  // of the call: latencies are the calls', hedges included
};

}  // namespace detail

/// A policy layer that sends a second attempt when the first is slow (tower's
/// Hedge, Polly's hedging, "The Tail at Scale"): after a fixed delay, or the
/// `quantile` of recent latencies, the inner layers run a second time; the
/// first attempt to succeed wins, the other is cancelled (terminal) and
/// awaited before the call returns.
///
/// - An attempt that fails before the hedge started ends the call with its
///   exception (hedging is for latency; retries are `retry_layer`'s job);
///   once both run, a failure waits for the other attempt, and when both
///   fail the first attempt's exception is rethrown.
/// - `fn` (and every layer inside) runs twice at once for a hedged call:
///   it must allow that (no state shared between its attempts).
/// - Counted against the same limits: put `hedge` outside the limit layers
///   and each attempt takes them (a hedge waits for its permit like any
///   call). A lost attempt ends with `operation_aborted`, so a limit layer's
///   `linger` keeps its permit as for any abandoned call.
/// - Budget: hedges stay at or below `budget` × the calls so far.
/// - Time is the caller's executor's clock (exact in virtual time).
/// - Per-Operation Cancellation: cancelling the caller cancels both attempts,
///   waits for them and throws `operation_aborted`.
/// - Counts and latencies under one mutex: thread-safe; each call's attempts
///   run on the caller's executor.
///
/// @code
/// auto p = sluice::policy(sluice::hedge({.quantile = 0.95, .budget = 0.05}),
///                         sluice::shed(cap), sluice::timeout(2s));
/// @endcode
class hedge_layer {
 public:
  /// The layer with configuration `o`; `std::invalid_argument` for a negative
  /// budget, a quantile outside [0, 1) or an empty window.
  explicit hedge_layer(hedge_options o) : core_(std::make_unique<detail::hedge_core>(o)) {}

  /// Runs `next()`, and a second `next()` after the delay (see the class).
  template <class Next>
  auto call(Next next) -> std::invoke_result_t<Next&> {
    using A = std::invoke_result_t<Next&>;
    using T = task_result_t<A>;
    using Executor = task_executor_t<A>;
    const auto caller = co_await asio::this_coro::cancellation_state;
    if (caller.cancelled() != asio::cancellation_type::none)
      throw system_error(asio::error::operation_aborted, "sluice::hedge: cancelled before start");
    const Executor ex = co_await asio::this_coro::executor;
    const clock::duration delay = core_->begin();
    auto race = std::make_shared<detail::hedge_race<T>>();
    race->start = sluice::now(ex);
    auto& children = *race->children;
    children.spawn(ex, attempt<T, Executor>(0, race, next, core_.get()));
    children.spawn(ex, hedge_timer<T, Executor>(ex, delay, race, next, core_.get()));
    const bool throw_before = co_await asio::this_coro::throw_if_cancelled();
    co_await asio::this_coro::throw_if_cancelled(false);
    if (caller.cancelled() != asio::cancellation_type::none) children.cancel_from_parent();
    error_code ec;
    co_await children.join(ex, ec);
    co_await asio::this_coro::throw_if_cancelled(throw_before);
    if (ec) throw system_error(ec, "sluice::hedge");
    if (race->won) {
      if constexpr (std::is_void_v<T>) {
        co_return;
      } else {
        co_return std::move(*race->value);
      }
    }
    std::rethrow_exception(race->error[0] ? race->error[0] : race->error[1]);
  }

  /// Counts since construction, and the delay the next call would use.
  [[nodiscard]] hedge_stats stats() { return core_->stats(); }

 private:
  template <class T, class Executor, class Next>
  static asio::awaitable<void, Executor> attempt(int i, std::shared_ptr<detail::hedge_race<T>> r,
                                                 Next& next, detail::hedge_core* core) {
    const auto ex = co_await asio::this_coro::executor;
    const std::size_t self = i == 0 ? 0 : 2;
    try {
      if constexpr (std::is_void_v<T>) {
        co_await next();
        if (!r->won) r->value.emplace();
      } else {
        auto v = co_await next();
        if (!r->won) r->value.emplace(std::move(v));
      }
      r->done[i] = true;
      if (r->won) co_return;
      r->won = true;
      core->succeeded(sluice::now(ex) - r->start, i == 1);
      r->children->cancel_all(self);
      co_return;
    } catch (...) {
      r->error[i] = std::current_exception();
    }
    r->done[i] = true;
    // Failed before the hedge started: no hedge; the call ends with this.
    if (i == 0 && !r->hedge_started) r->children->cancel(1);
  }

  template <class T, class Executor, class Next>
  static asio::awaitable<void, Executor> hedge_timer(Executor ex, clock::duration delay,
                                                     std::shared_ptr<detail::hedge_race<T>> r,
                                                     Next& next, detail::hedge_core* core) {
    if (delay == clock::duration::max()) co_return;
    try {
      co_await sleep_for(ex, delay);
    } catch (...) {
      co_return;  // the first attempt ended (or the caller was cancelled)
    }
    if (r->done[0] || r->won || r->children->stopping() || !core->try_hedge()) co_return;
    r->hedge_started = true;
    r->children->spawn(ex, attempt<T, Executor>(1, r, next, core));
  }

  template <class Executor>
  static asio::awaitable<void, Executor> sleep_for(const Executor& ex, clock::duration d) {
    co_await detail::wait_until(ex, detail::find_virtual_clock(ex),
                                detail::add_saturating(sluice::now(ex), d));
  }

  std::unique_ptr<detail::hedge_core> core_;
};

/// A `hedge_layer` with configuration `o` (see there).
[[nodiscard]] inline hedge_layer hedge(hedge_options o) {
  return hedge_layer(o);
}

}  // namespace sluice

#if SLUICE_HEADER_DEFS
#include <sluice/impl/hedge.ipp>
#endif

#endif  // SLUICE_HEDGE_HPP
