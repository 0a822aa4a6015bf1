// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_LIMITS_HPP
#define SLUICE_LIMITS_HPP

#include <sluice/acquire_all.hpp>
#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/linger.hpp>
#include <sluice/policy.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace sluice {

/// A budget of a `sluice::limits` layer that each call takes by its weight:
/// `sluice::limits(cap, rpm, sluice::weighted(tpm))` with
/// `co_await policy(fn, sluice::weight(tokens))`. Made by `sluice::weighted`.
template <class L>
struct weighted_by_call {
  L* limit;  ///< the limiter (`rate_limiter`, `token_bucket`, `strand_bound` of one)
};

/// `limit` as a budget of a `sluice::limits` layer taken by each call's
/// weight (`limit.weighted(w.units)`, see `sluice::call_weight`). `L`: a
/// limiter with `weighted(n)` (`rate_limiter`, `token_bucket`,
/// `strand_bound<L>` of those). `limit` must outlive the layer.
template <class L>
requires requires(L& l, std::size_t n) {
  l.weighted(n);
}
[[nodiscard]] weighted_by_call<L> weighted(L& limit) noexcept {
  return {&limit};
}

namespace detail {

// What a limits_layer keeps of a budget: a pointer to a limit, or the
// weighted_by_call that names one.
template <class B>
struct limit_slot {
  using type = B*;
  static type make(B& b) noexcept { return &b; }
  static B& take(type p, call_weight) noexcept { return *p; }
};
template <class L>
struct limit_slot<weighted_by_call<L>> {
  using type = weighted_by_call<L>;
  static type make(weighted_by_call<L> b) noexcept { return b; }
  static auto take(type b, call_weight w) { return b.limit->weighted(w.units); }
};

template <class B>
inline constexpr bool is_weighted_by_call = false;
template <class L>
inline constexpr bool is_weighted_by_call<weighted_by_call<L>> = true;

}  // namespace detail

/// A policy layer that takes several budgets at once for the inner call,
/// through `sluice::acquire_all` (every budget in one instant, or none), and
/// holds them until the inner call returns: `sluice::limits(cap, rpm)`.
///
/// - Budgets: what `acquire_all` accepts as lvalues (`semaphore`,
///   `adaptive_limit`, `rate_limiter`, `token_bucket`, `shared_semaphore`,
///   `strand_bound<L>` of those); FIFO, cancellation and thread safety as
///   there: over `shared_semaphore` and `strand_bound<L>` budgets the layer
///   may be shared by every thread of a server, over loop-affine ones it is
///   loop-affine.
/// - Per-call weights: a budget named `sluice::weighted(tpm)` is taken by
///   the call's weight, `tpm.weighted(n)` for a call made as
///   `co_await policy(fn, sluice::weight(n))` (1 without a weight); each
///   attempt takes it again (see `sluice::call_policy`). A weight the
///   limiter could never grant throws `std::invalid_argument` there, holding
///   nothing.
/// - Provider-side accounting, `linger_for(d)`: a call abandoned by a timeout
///   (`sluice::timeout_error`) or a cancellation (`operation_aborted`, also a
///   hedge that lost) keeps its permits for `d` after it ended, so that the
///   provider, which may still be working on the request it no longer has a
///   client for, counts against the cap. The caller gets its error at once;
///   the permits stay with a timer the layer owns: `join()` awaits the ones
///   still held (await it before destroying the layer or its limits). The
///   default is no linger: every sluice layer already awaits the abandoned
///   operation until it has ended on the client's side (`with_timeout`
///   cancels and waits), which is all the client can see; set `d` to how long
///   the provider may go on after the client gave up (its own timeout).
/// - Lifetimes: the budgets must outlive the layer.
///
/// @code
/// sluice::semaphore cap{8};
/// sluice::rate_limiter rpm{600, 1min}, tpm{100000, 1min};
/// auto p = sluice::policy(sluice::limits(cap, rpm, sluice::weighted(tpm)).linger_for(5s),
///                         sluice::timeout(2s));
/// co_await p([&] { return complete(prompt); }, sluice::weight(prompt.tokens));
/// @endcode
template <class... Budgets>
class limits_layer {
 public:
  /// The layer over `budgets` (each a limit, or a `weighted_by_call`).
  explicit limits_layer(Budgets&... budgets)
      : budgets_(detail::limit_slot<Budgets>::make(budgets)...) {}

  /// Keeps an abandoned call's permits for `d` after it ended (see the class).
  [[nodiscard]] limits_layer linger_for(clock::duration d) && {
    linger_ = d;
    return std::move(*this);
  }

  /// Takes every budget (a weighted one by 1), then awaits `next()` holding them.
  template <class Next>
  auto call(Next next) -> std::invoke_result_t<Next&> {
    return call(std::move(next), call_weight{});
  }

  /// Takes every budget, a weighted one by `w`, then awaits `next()` holding them.
  template <class Next>
  auto call(Next next, call_weight w) -> std::invoke_result_t<Next&> {
    auto held = co_await take(w, std::index_sequence_for<Budgets...>{});
    if (linger_ <= clock::duration::zero()) co_return co_await next();
    co_return co_await detail::call_holding(lingering_, linger_, std::move(held), next);
  }

  /// Abandoned calls whose permits linger now.
  [[nodiscard]] std::size_t lingering() const { return lingering_.lingering(); }
  /// Completes when no permit lingers.
  [[nodiscard]] asio::awaitable<void> join() {
    const auto ex = co_await asio::this_coro::executor;  // named: see linger_set::join
    co_await lingering_.join(ex);
  }

 private:
  template <std::size_t... I>
  auto take(call_weight w, std::index_sequence<I...>) {
    return acquire_all(detail::limit_slot<Budgets>::take(std::get<I>(budgets_), w)...);
  }

  std::tuple<typename detail::limit_slot<Budgets>::type...> budgets_;
  clock::duration linger_ = clock::duration::zero();
  detail::linger_set lingering_;
};

/// A `limits_layer` over `budgets` (see there): limits by reference, and
/// `sluice::weighted(limit)` for a budget taken by each call's weight.
template <class... Budgets>
requires(sizeof...(Budgets) > 0 &&
         ((std::is_lvalue_reference_v<Budgets> ||
           detail::is_weighted_by_call<std::remove_cvref_t<Budgets>>)&&...))
    [[nodiscard]] limits_layer<std::remove_cvref_t<Budgets>...> limits(Budgets&&... budgets) {
  return limits_layer<std::remove_cvref_t<Budgets>...>(budgets...);
}

}  // namespace sluice

#endif  // SLUICE_LIMITS_HPP
