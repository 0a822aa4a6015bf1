// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_RETRY_HPP
#define SLUICE_RETRY_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/affinity.hpp>
#include <sluice/detail/virtual_clock.hpp>
#include <sluice/time.hpp>
#include <sluice/timeout.hpp>

#include <sluice/detail/asio.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace sluice {

/// The hint a provider gives with a refusal: "try again after `after`" (HTTP
/// `Retry-After`). An exception carries it by deriving from it, beside its
/// usual base:
///
/// @code
/// struct http_429 : std::runtime_error, sluice::retry_after {
///   http_429(std::string what, sluice::clock::duration d)
///       : std::runtime_error(std::move(what)), sluice::retry_after{d} {}
/// };
/// @endcode
///
/// `sluice::retryable` retries such an error, and `sluice::retry` waits exactly
/// `after` before the next attempt (the hint wins over the backoff; a negative
/// hint counts as zero). `sluice::testing::throttled_error` carries one.
struct retry_after {
  saturating_duration after{};  ///< how long the provider asks the caller to wait (any duration)
};

/// A call the provider refused for now (HTTP 429, 503): retryable by default.
/// Throw it (or derive from it) where a client sees a throttle without a
/// hint; with a hint, derive from `sluice::retry_after` as well.
class throttled_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The default `retry_if`: true for a throttle (`sluice::throttled_error`), a
/// timeout (`sluice::timeout_error`, or a `system_error` whose code is
/// `asio::error::timed_out`), and any exception that carries a
/// `sluice::retry_after` hint. False for everything else, in particular for
/// `operation_aborted` (the caller's own cancellation or deadline) and for a
/// null pointer. Never throws.
[[nodiscard]] inline bool retryable(const std::exception_ptr& e) noexcept {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const retry_after&) {
    return true;
  } catch (const throttled_error&) {
    return true;
  } catch (const timeout_error&) {
    return true;
  } catch (const system_error& x) {
    return x.code() == asio::error::timed_out;
  } catch (...) {
    return false;
  }
}

/// The `retry_after` hint `e` carries, if any (negative hints read as zero).
[[nodiscard]] inline std::optional<clock::duration> retry_after_of(
    const std::exception_ptr& e) noexcept {
  if (!e) return std::nullopt;
  try {
    std::rethrow_exception(e);
  } catch (const retry_after& h) {
    return std::max<clock::duration>(h.after, clock::duration::zero());
  } catch (...) {
    return std::nullopt;
  }
}

/// How the backoff delay is randomised (AWS's "Exponential Backoff and Jitter").
enum class jitter_kind {
  none,   ///< exactly `min(max, first * 2^k)`
  full,   ///< uniform in [0, that): decorrelates callers best
  equal,  ///< half of it, plus uniform in [0, the other half)
};
/// `backoff::jitter`: no jitter.
inline constexpr jitter_kind no_jitter = jitter_kind::none;
/// `backoff::jitter`: full jitter (the default).
inline constexpr jitter_kind full_jitter = jitter_kind::full;
/// `backoff::jitter`: equal jitter.
inline constexpr jitter_kind equal_jitter = jitter_kind::equal;

class retry_budget;
namespace detail {
struct retry_budget_access;
}  // namespace detail

/// The policy of `sluice::retry`; designated initializers:
/// `sluice::backoff{.first = 100ms, .max = 30s, .attempts = 6, .jitter = sluice::full_jitter}`.
///
/// Retry number k (k = 0 before the second attempt) waits `min(max, first * 2^k)`
/// scaled by `jitter`, or exactly the `retry_after` hint the error carries.
struct backoff {
  saturating_duration first = std::chrono::milliseconds(100);  ///< the base of the first retry
  saturating_duration max = std::chrono::seconds(30);          ///< no backoff delay exceeds it
  std::size_t attempts = 5;  ///< attempts in all, the first one included (1: never retry)
  /// No retry is scheduled whose wait would end more than this after the first
  /// attempt started; the last error passes through instead.
  saturating_duration max_elapsed = clock::duration::max();
  jitter_kind jitter = full_jitter;  ///< how the delay is randomised
  /// The jitter's seed. Unset: a fixed seed under `sluice::testing::virtual_loop`
  /// (runs are reproducible), `std::random_device` otherwise. Each call draws
  /// its own stream from (seed, the call's number on its execution context),
  /// so callers that fail together do not retry together.
  std::optional<std::uint64_t> seed = std::nullopt;
  /// Which exceptions are retried; the rest pass through at once.
  std::function<bool(const std::exception_ptr&)> retry_if = retryable;
  /// Shared by callers to cap retries at a ratio of first attempts (null: no cap).
  /// Must outlive the call.
  retry_budget* budget = nullptr;

  /// The delay before retry number `k` given a draw `u` in [0, 1) (`u` is
  /// ignored without jitter). Exposed so a caller can print its schedule.
  [[nodiscard]] clock::duration delay(std::size_t k, double u) const noexcept {
    const clock::duration cap = max;
    clock::duration base = first;
    for (std::size_t i = 0; i < k && base < cap; ++i) base = base > cap / 2 ? cap : base * 2;
    base = std::min(base, cap);
    const auto scaled = [u](clock::duration d) {
      return clock::duration(static_cast<clock::duration::rep>(static_cast<double>(d.count()) * u));
    };
    switch (jitter) {
      case jitter_kind::full:
        return scaled(base);
      case jitter_kind::equal:
        return base - base / 2 + scaled(base / 2);
      case jitter_kind::none:
        break;
    }
    return base;
  }
};

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
/// - Loop-affine, like the other primitives; time comes from the callers'
///   clock (virtual under the test loop): do not share one budget between a
///   virtual loop and a real one.
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
    if (!(opt_.ratio >= 0.0) || !std::isfinite(opt_.ratio))
      throw std::invalid_argument("sluice::retry_budget: ratio must be finite and >= 0");
    if (opt_.per <= clock::duration::zero())
      throw std::invalid_argument("sluice::retry_budget: the window `per` must be positive");
  }
  retry_budget(const retry_budget&) = delete;
  retry_budget& operator=(const retry_budget&) = delete;

  /// The parameters.
  [[nodiscard]] const options& config() const noexcept { return opt_; }
  /// First attempts in the window as of the last use.
  [[nodiscard]] std::size_t first_attempts() const noexcept { return firsts_.total; }
  /// Retries in the window as of the last use.
  [[nodiscard]] std::size_t retries() const noexcept { return retries_.total; }
  /// Retries refused since construction (each let an error pass through).
  [[nodiscard]] std::size_t refused() const noexcept { return refused_; }

 private:
  friend struct detail::retry_budget_access;
  static constexpr const char* name = "sluice::retry_budget";

  template <class Executor>
  void record_first_attempt(const Executor& ex, clock::time_point now) {
    affinity_.bind(ex);
    const auto in = affinity_.enter(name);
    firsts_.add(now);
    firsts_.expire(now, opt_.per);
  }
  // Counts a retry at `now` if it fits; else counts a refusal.
  bool try_retry(clock::time_point now) {
    const auto in = affinity_.enter(name);
    firsts_.expire(now, opt_.per);
    retries_.expire(now, opt_.per);
    const double allowed = opt_.ratio * static_cast<double>(firsts_.total) +
                           static_cast<double>(opt_.min_retries) + 1e-9;
    if (static_cast<double>(retries_.total + 1) > allowed) {
      ++refused_;
      return false;
    }
    retries_.add(now);
    return true;
  }
  // Forgets a retry counted at `at` that never ran (its caller was cancelled).
  void give_back(clock::time_point at) noexcept { retries_.remove(at); }
  // (instant, count) in increasing time; total is the sum of the counts.
  struct window {
    /// Retries counted at one instant.
    struct entry {
      clock::time_point at;  ///< the instant
      std::size_t count;     ///< retries counted at it
    };
    std::deque<entry> entries;
    std::size_t total = 0;
    void add(clock::time_point t) {
      if (!entries.empty() && entries.back().at == t) {
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
    void remove(clock::time_point t) noexcept {
      for (auto it = entries.end(); it != entries.begin();) {
        --it;
        if (it->at < t) return;
        if (it->at == t) {
          --total;
          if (--it->count == 0) entries.erase(it);
          return;
        }
      }
    }
  };

  options opt_;
  window firsts_, retries_;
  std::size_t refused_ = 0;
  [[no_unique_address]] detail::affinity affinity_;
};

namespace detail {

// Per execution context: the default jitter seed (fixed in virtual time) and
// a counter that gives each retry call its own stream of draws.
class retry_seed_service final : public asio::execution_context::service {
 public:
  using key_type = retry_seed_service;
  inline static asio::execution_context::id id;
  static constexpr std::uint64_t virtual_seed = 0x5eed5eed5eedULL;

  explicit retry_seed_service(asio::execution_context& ctx)
      : asio::execution_context::service(ctx),
        seed_(asio::has_service<virtual_clock_service>(ctx) ? virtual_seed : random_seed()) {}

  [[nodiscard]] std::uint64_t seed() const noexcept { return seed_; }
  std::uint64_t next_call() noexcept { return calls_.fetch_add(1, std::memory_order_relaxed); }

 private:
  void shutdown() override {}
  static std::uint64_t random_seed() {
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  }
  std::uint64_t seed_;
  std::atomic<std::uint64_t> calls_{0};
};

// sluice::retry's way into a budget's private members.
struct retry_budget_access {
  template <class Executor>
  static void first_attempt(retry_budget& b, const Executor& ex, clock::time_point now) {
    b.record_first_attempt(ex, now);
  }
  static bool try_retry(retry_budget& b, clock::time_point now) { return b.try_retry(now); }
  static void give_back(retry_budget& b, clock::time_point at) noexcept { b.give_back(at); }
};

// splitmix64: a deterministic, portable hash of (seed, index). The jitter
// draws and slow_service's models come from it.
constexpr std::uint64_t mix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline void check_backoff(const backoff& p) {
  if (p.attempts == 0)
    throw std::invalid_argument("sluice::retry: backoff.attempts must be at least 1 (1: no retry)");
  if (p.first < clock::duration::zero() || p.max < clock::duration::zero())
    throw std::invalid_argument("sluice::retry: backoff.first and backoff.max must be >= 0");
  if (p.max_elapsed < clock::duration::zero())
    throw std::invalid_argument("sluice::retry: backoff.max_elapsed must be >= 0");
  if (!p.retry_if) throw std::invalid_argument("sluice::retry: backoff.retry_if is empty");
}

template <class F, class T, class Executor>
asio::awaitable<T, Executor> retry_loop(backoff p, F fn) {
  const auto ex = co_await asio::this_coro::executor;
  const auto state = co_await asio::this_coro::cancellation_state;
  auto& ctx = asio::query(ex, asio::execution::context_as<asio::execution_context&>);
  virtual_clock_service* vclock = find_virtual_clock(ctx);
  auto& seeds = asio::use_service<retry_seed_service>(ctx);
  const std::uint64_t stream = mix(p.seed.value_or(seeds.seed()) ^ mix(seeds.next_call()));
  const auto now = [vclock] {
    return vclock ? vclock->now() : clock::now();
  };
  const clock::time_point start = now();
  if (p.budget) retry_budget_access::first_attempt(*p.budget, ex, start);

  for (std::size_t attempt = 0;; ++attempt) {
    std::exception_ptr error;
    try {
      if constexpr (std::is_void_v<T>) {
        co_await fn();
        co_return;
      } else {
        co_return co_await fn();
      }
    } catch (...) {
      error = std::current_exception();
    }
    // No co_await inside the handler: decide, then wait outside it.
    if (state.cancelled() != asio::cancellation_type::none) std::rethrow_exception(error);
    if (!p.retry_if(error)) std::rethrow_exception(error);
    if (attempt + 1 >= p.attempts) std::rethrow_exception(error);
    const auto hint = retry_after_of(error);
    const double u = static_cast<double>(mix(stream + attempt) >> 11) * 0x1.0p-53;  // [0, 1)
    const clock::duration wait = hint ? *hint : p.delay(attempt, u);
    const clock::time_point t = now();
    if (t - start > p.max_elapsed || wait > p.max_elapsed - (t - start))
      std::rethrow_exception(error);
    if (p.budget && !retry_budget_access::try_retry(*p.budget, t)) std::rethrow_exception(error);
    error = nullptr;  // not kept alive across the wait
    // Saturated, as sleep() does: a hint (or a backoff max) of
    // clock::duration::max() waits until cancelled, it does not wrap.
    const clock::time_point deadline = add_saturating(t, wait);
    try {
      co_await wait_until(ex, vclock, deadline);
    } catch (...) {
      if (p.budget) retry_budget_access::give_back(*p.budget, t);  // the retry never ran
      throw;
    }
    // Cancelled as the wait ended (the same instant): no new attempt.
    if (state.cancelled() != asio::cancellation_type::none) {
      if (p.budget) retry_budget_access::give_back(*p.budget, t);
      throw system_error(asio::error::operation_aborted, "sluice::retry");
    }
  }
}

}  // namespace detail

/// Calls `fn()` and awaits the task it returns; while that throws an error
/// `policy.retry_if` accepts, waits and calls `fn()` again, up to
/// `policy.attempts` attempts in all. Returns the first successful result.
///
/// - `fn` is called anew for each attempt, so each attempt re-acquires the
///   limits `fn` takes (a semaphore permit, a rate-limiter start) and none is
///   held during the wait. `fn` is moved into the call and must be callable
///   repeatedly; what it references must outlive the call.
/// - The wait before retry k (k = 0 first) is `min(max, first * 2^k)` scaled
///   by the jitter, drawn from the seed (reproducible under
///   `sluice::testing::virtual_loop`), or exactly the `sluice::retry_after`
///   the error carries. Waits use the clock of the caller's executor (exact
///   in virtual time); a wait past the clock's range (a hint of
///   `clock::duration::max()`) lasts until the caller is cancelled.
/// - The last exception is rethrown unchanged (the same object): after the
///   last attempt; when the next wait would end past `max_elapsed` after the
///   first attempt started; when `budget` refuses the retry; when the caller
///   was cancelled during the attempt. An exception `retry_if` rejects is
///   rethrown at once, with no wait.
/// - Per-Operation Cancellation: the caller's cancellation reaches the
///   running attempt through `fn`'s task (as any awaited task); a wait
///   between attempts ends at once with `system_error(operation_aborted)` and
///   no further attempt starts. Nothing is left running: the attempts run
///   inside the call, one at a time. As for `sluice::sleep`, by default only
///   terminal cancellation reaches the wait.
/// - Resumes on the caller's executor.
/// - Throws `std::invalid_argument` at the call for `attempts == 0`, negative
///   durations, or an empty `retry_if`.
///
/// @code
/// auto reply = co_await sluice::retry(
///     sluice::backoff{.first = 100ms, .max = 30s, .attempts = 6, .jitter = sluice::full_jitter},
///     [&] { return sluice::with_timeout(2s, call_llm(prompt)); });  // a timeout is retried
/// @endcode
template <class F>
requires std::invocable<F&> && task<std::invoke_result_t<F&>>
[[nodiscard]] auto retry(backoff policy, F fn)
    -> asio::awaitable<task_result_t<std::invoke_result_t<F&>>,
                       task_executor_t<std::invoke_result_t<F&>>> {
  detail::check_backoff(policy);
  using A = std::invoke_result_t<F&>;
  return detail::retry_loop<F, task_result_t<A>, task_executor_t<A>>(std::move(policy),
                                                                     std::move(fn));
}

}  // namespace sluice

#endif  // SLUICE_RETRY_HPP
