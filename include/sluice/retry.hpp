// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_RETRY_HPP
#define SLUICE_RETRY_HPP

// sluice::retry and its policy (backoff). The errors it retries are in
// retryable.hpp, the budget shared by callers in retry_budget.hpp.

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/virtual_clock.hpp>
#include <sluice/retry_budget.hpp>
#include <sluice/retryable.hpp>
#include <sluice/time.hpp>

#include <sluice/detail/asio.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace sluice {

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
  /// (runs are reproducible), otherwise one drawn from the clocks and the
  /// execution context's address when the context first retries. Each call draws
  /// its own stream from (seed, the call's number on its execution context),
  /// so callers that fail together do not retry together.
  std::optional<std::uint64_t> seed = std::nullopt;
  /// Which exceptions are retried; the rest pass through at once. If it
  /// throws, the call ends with `sluice::callback_error` carrying that
  /// exception, the attempt's own error nested in it.
  std::function<bool(const std::exception_ptr&)> retry_if = retryable;
  /// Shared by callers to cap retries at a ratio of first attempts (null: no cap).
  /// Must outlive the call.
  retry_budget* budget = nullptr;
  /// Called once per retry, when it is decided (the budget has agreed) and
  /// before its wait: `on_retry(attempt, error, delay)`, with `attempt` the
  /// number of the attempt that just failed (1 for the first), `error` its
  /// exception, and `delay` the wait before attempt `attempt + 1` (the
  /// `retry_after` hint or the backoff's draw). Where tenacity's
  /// `before_sleep`, resilience4j's `onRetry` and Polly's `OnRetry` log and
  /// count retries. Runs inline on the caller's executor and must not
  /// wait. An exception it throws ends the call: that exception propagates,
  /// no wait and no further attempt, and the retry's place in the budget is
  /// given back. Empty (the default): nothing is called.
  std::function<void(std::size_t attempt, const std::exception_ptr& error, clock::duration delay)>
      on_retry{};

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
namespace detail {

// splitmix64: a deterministic, portable hash of (seed, index). The jitter
// draws and slow_service's models come from it.
constexpr std::uint64_t mix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Per execution context: the default jitter seed (fixed in virtual time) and
// a counter that gives each retry call its own stream of draws.
class retry_seed_service final : public asio::execution_context::service {
 public:
  using key_type = retry_seed_service;
  inline static asio::execution_context::id id;
  static constexpr std::uint64_t virtual_seed = 0x5eed5eed5eedULL;

  explicit retry_seed_service(asio::execution_context& ctx)
      : asio::execution_context::service(ctx),
        seed_(asio::has_service<virtual_clock_service>(ctx) ? virtual_seed : entropy_seed(&ctx)) {}

  [[nodiscard]] std::uint64_t seed() const noexcept { return seed_; }
  std::uint64_t next_call() noexcept { return calls_.fetch_add(1, std::memory_order_relaxed); }

 private:
  void shutdown() override {}
  // Differs between processes and contexts: both clocks and the context's
  // address, mixed (not std::random_device: <random> costs every includer
  // half a second of parsing, issue 32).
  static std::uint64_t entropy_seed(const void* ctx) noexcept {
    const auto count = [](auto t) {
      return static_cast<std::uint64_t>(t.time_since_epoch().count());
    };
    return mix(
        count(std::chrono::system_clock::now()) ^
        mix(count(std::chrono::steady_clock::now()) ^ reinterpret_cast<std::uintptr_t>(ctx)));
  }
  std::uint64_t seed_;
  std::atomic<std::uint64_t> calls_{0};
};

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
    bool again = false;
    try {
      again = p.retry_if(error);
    } catch (...) {
      throw_callback_failure("sluice::retry: retry_if", error);
    }
    if (!again) std::rethrow_exception(error);
    if (attempt + 1 >= p.attempts) std::rethrow_exception(error);
    const auto hint = retry_after_of(error);
    const double u = static_cast<double>(mix(stream + attempt) >> 11) * 0x1.0p-53;  // [0, 1)
    const clock::duration wait = hint ? *hint : p.delay(attempt, u);
    const clock::time_point t = now();
    if (t - start > p.max_elapsed || wait > p.max_elapsed - (t - start))
      std::rethrow_exception(error);
    if (p.budget && !retry_budget_access::try_retry(*p.budget, t)) std::rethrow_exception(error);
    if (p.on_retry) {
      try {
        p.on_retry(attempt + 1, std::as_const(error), wait);
      } catch (...) {
        if (p.budget) retry_budget_access::give_back(*p.budget, t);  // the retry never ran
        throw;
      }
    }
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
/// - `policy.on_retry(attempt, error, delay)`, if set, is called once per
///   retry, before its wait (see `backoff::on_retry`): the place to log and
///   count retries.
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
