// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_POLICY_HPP
#define SLUICE_POLICY_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/count_arg.hpp>

#include <concepts>
#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace sluice {

/// The weight of one call through a policy: how many units it takes of each
/// budget named `sluice::weighted(limit)` in a `sluice::limits` layer (the
/// prompt's tokens of a tokens-per-minute limiter). Make it with
/// `sluice::weight(n)`; a call made without one weighs 1.
struct call_weight {
  std::size_t units = 1;  ///< units per weighted budget
};

/// `call_weight{n}`: `co_await policy(fn, sluice::weight(prompt_tokens))`.
/// `n` may be of any integer type; negative: `std::invalid_argument`. A
/// weight a limiter could never grant (0, or more than its quota) is refused
/// by that limiter when the call reaches it, with `std::invalid_argument`.
template <detail::count_integer I>
[[nodiscard]] call_weight weight(I n) {
  return call_weight{detail::to_count(n, "sluice::weight")};
}

/// How a call to a provider is made: a list of layers, outermost first, each
/// with one job (shed load, break the circuit, retry, take limits, time out),
/// applied to a call in one line: `co_await policy([&] { return call(req); })`.
/// Build one with `sluice::policy(layers...)`.
///
/// A layer is any object with a member template `call(next)` where `next` is
/// a callable returning the inner task (`asio::awaitable<T, Executor>`), and
/// `call` returns an `asio::awaitable<T, Executor>` that awaits `next()` zero,
/// one or several times. sluice's layers: `sluice::shed` (a limit with a bound
/// on its waiters), `sluice::breaker`, `sluice::retry_layer`,
/// `sluice::limits` (several budgets at once), `sluice::timeout`.
///
/// Order is the user's, and it matters (read it top-down, as tower's
/// `ServiceBuilder`):
/// - `retry_layer` outside a limit layer re-queues each attempt: the permit is
///   released while the retry sleeps and taken again (fair to the other
///   callers; an attempt may wait behind them). Inside it, the permit is held
///   through the backoff (the retry never re-queues; the permit idles).
/// - `breaker` outside `retry_layer` records one outcome per call (after its
///   retries); inside, one per attempt, and an open breaker stops the
///   retries at once (its `breaker_open_error` is not retryable by default).
/// - `shed` outermost fails fast before anything else runs; a `timeout`
///   outside a limit counts the wait for the limit in the time, inside it only
///   the provider's part.
///
/// - Per-call weight: `co_await policy(fn, sluice::weight(n))` hands `n` to
///   every layer that takes one (`call(next, weight)`; `sluice::limits`
///   takes `n` units of each budget named `sluice::weighted(limit)`); the
///   others see `call(next)`. The weight belongs to the call, not to an
///   attempt: every attempt spends it again — each retry of a `retry_layer`
///   outside the limits and each hedge of a `hedge` outside them takes its
///   `n` units afresh (the provider counts each request it receives), and a
///   hedge budget of 5% extra calls may cost up to 5% extra units.
/// - Composition is by type: each layer calls the next directly, nothing is
///   type-erased and nothing is allocated per call beyond the coroutine frames
///   (from Asio's per-thread recycling allocator).
/// - Runs everything inside the call, on the caller's executor, and resumes
///   there; nothing outlives the call (except where a layer says otherwise).
/// - Per-Operation Cancellation: the caller's cancellation reaches the
///   innermost task and every wait of the layers, which each keep their own
///   guarantee (no permit lost, a sleeping retry ends at once).
/// - Thread safety: one policy may be shared by coroutines on several threads
///   when each of its layers is: `breaker` and `shed`'s counters are; a limit
///   is when it is (`shared_semaphore`, `strand_bound<L>`, the Redis limits);
///   `limits` is when its budgets are (`shared_semaphore`, `strand_bound<L>`);
///   `retry_layer` is, with or without a `retry_budget`.
/// - Lifetimes: the policy must outlive its calls; the limits it names must
///   outlive the policy. `fn` is moved into the call frame and may be called
///   several times (by a retry).
///
/// @code
/// sluice::shared_semaphore cap{8};
/// auto provider = sluice::policy(
///     sluice::shed(cap, {.max_waiting = 64}),                       // 429 past 64 waiting
///     sluice::breaker({.failure_rate = 0.5, .window = 20, .open_for = 10s}),
///     sluice::timeout(3s));
/// reply r = co_await provider([&] { return call_backend(req); });
/// @endcode
template <class... Layers>
class call_policy {
 public:
  /// The layers, outermost first.
  explicit call_policy(Layers... layers) : layers_(std::move(layers)...) {}
  /// Moves the layers (their counters with them).
  call_policy(call_policy&&) noexcept = default;
  call_policy(const call_policy&) = delete;
  call_policy& operator=(const call_policy&) = delete;

  /// Calls `fn()` through every layer, outermost first, and returns its
  /// result or rethrows what a layer or the call threw. A caller whose
  /// cancellation was requested before it called gets `operation_aborted` at
  /// once: no layer sees it (no breaker trial, hedge or permit is spent). `fn` returns
  /// `asio::awaitable<T, Executor>`; it is called once per attempt.
  template <class F>
  requires std::invocable<F&> && task<std::invoke_result_t<F&>>
  [[nodiscard]] auto operator()(F fn) -> std::invoke_result_t<F&> {
    // A coroutine: `fn` lives in this frame while the layers run.
    detail::refuse_if_cancelled(co_await asio::this_coro::cancellation_state, "sluice::policy");
    co_return co_await run<0>(fn, call_weight{});
  }

  /// As `(*this)(fn)`, for a call of weight `w` (`sluice::weight(n)`): each
  /// attempt takes `w.units` of every budget named `sluice::weighted(limit)`
  /// in the policy's `limits` layers.
  template <class F>
  requires std::invocable<F&> && task<std::invoke_result_t<F&>>
  [[nodiscard]] auto operator()(F fn, call_weight w) -> std::invoke_result_t<F&> {
    detail::refuse_if_cancelled(co_await asio::this_coro::cancellation_state, "sluice::policy");
    co_return co_await run<0>(fn, w);
  }

  /// The completion-token form for callback users: runs `(*this)(fn)` as a
  /// coroutine on `ex` and completes `token` with
  /// `void(std::exception_ptr, T)` (`void(std::exception_ptr)` for `void`).
  /// Cancellation through the token's cancellation slot as for `co_spawn`.
  template <class Executor, class F, class CompletionToken>
  requires std::invocable<F&> && task<std::invoke_result_t<F&>>
  auto async_call(const Executor& ex, F fn, CompletionToken&& token) {
    return asio::co_spawn(ex, (*this)(std::move(fn)), std::forward<CompletionToken>(token));
  }

  /// Completes when every layer that keeps permits of abandoned calls
  /// (`linger`) holds none: await it before destroying the policy or its
  /// limits. At once for a policy without lingering layers.
  [[nodiscard]] asio::awaitable<void> join() { co_await join_from<0>(); }

  /// How many layers the policy has.
  static constexpr std::size_t layer_count = sizeof...(Layers);

  /// The I-th layer (outermost is 0), to read its stats.
  template <std::size_t I>
  requires(I < sizeof...(Layers)) [[nodiscard]] auto& get() noexcept {
    return std::get<I>(layers_);
  }
  /// The layer of type `L` (when only one has it).
  template <class L>
  [[nodiscard]] L& get() noexcept {
    return std::get<L>(layers_);
  }

 private:
  template <std::size_t I, class F>
  auto run(F& fn, call_weight w) -> std::invoke_result_t<F&> {
    if constexpr (I == sizeof...(Layers)) {
      return fn();
    } else {
      auto& layer = std::get<I>(layers_);
      auto next = [this, &fn, w] {
        return run<I + 1>(fn, w);
      };
      if constexpr (requires { layer.call(next, w); }) {
        return layer.call(std::move(next), w);
      } else {
        return layer.call(std::move(next));
      }
    }
  }

  template <std::size_t I>
  asio::awaitable<void> join_from() {
    if constexpr (I < sizeof...(Layers)) {
      if constexpr (requires(std::tuple_element_t<I, std::tuple<Layers...>> & l) { l.join(); })
        co_await std::get<I>(layers_).join();
      co_await join_from<I + 1>();
    }
  }

  std::tuple<Layers...> layers_;
};

/// Composes `layers` into a `call_policy`, outermost first (see there).
template <class... Layers>
[[nodiscard]] call_policy<std::decay_t<Layers>...> policy(Layers&&... layers) {
  return call_policy<std::decay_t<Layers>...>(std::forward<Layers>(layers)...);
}

}  // namespace sluice

#endif  // SLUICE_POLICY_HPP
