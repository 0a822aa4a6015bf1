// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_LIMITS_HPP
#define SLUICE_LIMITS_HPP

#include <sluice/acquire_all.hpp>
#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/linger.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace sluice {

/// A policy layer that takes several budgets at once for the inner call,
/// through `sluice::acquire_all` (every budget in one instant, or none), and
/// holds them until the inner call returns: `sluice::limits(cap, rpm)`.
///
/// - Budgets: what `acquire_all` accepts as lvalues (`semaphore`,
///   `adaptive_limit`, `rate_limiter`, `token_bucket`, `shared_semaphore`,
///   `strand_bound<L>` of those); FIFO, cancellation and thread safety as
///   there: over `shared_semaphore` and `strand_bound<L>` budgets the layer
///   may be shared by every thread of a server, over loop-affine ones it is
///   loop-affine. A per-call weight (`tpm.weighted(tokens)`) is not a
///   property of the policy: take such a budget inside `fn`.
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
/// sluice::rate_limiter rpm{600, 1min};
/// auto p = sluice::policy(sluice::limits(cap, rpm).linger_for(5s), sluice::timeout(2s));
/// @endcode
template <class... Budgets>
class limits_layer {
 public:
  /// The layer over `budgets`.
  explicit limits_layer(Budgets&... budgets) : budgets_(&budgets...) {}

  /// Keeps an abandoned call's permits for `d` after it ended (see the class).
  [[nodiscard]] limits_layer linger_for(clock::duration d) && {
    linger_ = d;
    return std::move(*this);
  }

  /// Takes every budget, then awaits `next()` holding them.
  template <class Next>
  auto call(Next next) -> std::invoke_result_t<Next&> {
    auto held = co_await std::apply([](auto*... b) { return acquire_all(*b...); }, budgets_);
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
  std::tuple<Budgets*...> budgets_;
  clock::duration linger_ = clock::duration::zero();
  detail::linger_set lingering_;
};

/// A `limits_layer` over `budgets` (see there).
template <class... Budgets>
requires(sizeof...(Budgets) > 0)
    [[nodiscard]] limits_layer<Budgets...> limits(Budgets&... budgets) {
  return limits_layer<Budgets...>(budgets...);
}

}  // namespace sluice

#endif  // SLUICE_LIMITS_HPP
