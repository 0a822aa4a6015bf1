// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_STRAND_CALLS_HPP
#define SLUICE_DETAIL_STRAND_CALLS_HPP

// strand_bound's parts that do not depend on the class: the state every call
// reaches through a weak reference (so nothing posted outlives the limit
// unsafely), the construction of L, and the small coroutines run on the
// strand for try_acquire and visit.

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/strand_permit.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace sluice {
template <class L>
class strand_bound;
}  // namespace sluice

namespace sluice::detail {

struct strand_access;  // acquire_all's way in (detail/all_strand_budget.hpp)

// `n` units of a strand_bound rate limiter or token bucket, as a budget of
// sluice::acquire_all (strand_bound::weighted).
template <class L>
struct strand_units {
  strand_bound<L>* bound;
  std::size_t n;
};

// The limit and its strand. strand_bound owns the only strong reference;
// everything it posts or hands to a hop holds a weak one and finds the limit
// gone (does nothing, or fails the call with operation_aborted) when the
// strand_bound was destroyed first.
template <class L>
struct strand_state {
  template <class... Args>
  explicit strand_state(asio::any_io_executor s, Args&&... args)
      : strand(std::move(s)), limit(make(strand, std::forward<Args>(args)...)) {}

  template <class... Args>
  static L make(const asio::any_io_executor& strand, Args&&... args) {
    if constexpr (std::is_constructible_v<L, const asio::any_io_executor&, Args&&...>) {
      return L(strand, std::forward<Args>(args)...);
    } else {
      return L(std::forward<Args>(args)...);
    }
  }

  asio::any_io_executor strand;
  L limit;
};

// The limit behind `w`, for a call made on the strand: operation_aborted
// when the strand_bound is gone.
template <class L>
std::shared_ptr<strand_state<L>> lock_state(const std::weak_ptr<strand_state<L>>& w) {
  auto s = w.lock();
  if (!s) throw system_error(asio::error::operation_aborted, "sluice::strand_bound: destroyed");
  return s;
}

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

// What strand_bound::try_acquire returns for L's try_acquire result `Inner`:
// an optional permit, or a permit that is empty when nothing was taken.
template <class Inner>
struct strand_try_result {
  using type = strand_permit<Inner>;
};
template <class P>
struct strand_try_result<std::optional<P>> {
  using type = std::optional<strand_permit<P>>;
};

template <class P, class A>
asio::awaitable<strand_permit<P>> wrap_permit_impl(asio::any_io_executor strand,
                                                   std::weak_ptr<void> alive, A a) {
  co_return strand_permit<P>(std::move(strand), co_await std::move(a), std::move(alive));
}
// The permit of L's scoped_acquire (the awaitable `a`), as a strand_permit.
template <class A>
auto wrap_permit(asio::any_io_executor strand, std::weak_ptr<void> alive, A a) {
  return wrap_permit_impl<task_result_t<A>>(std::move(strand), std::move(alive), std::move(a));
}

template <class L, class... Args>
asio::awaitable<bool> try_on_strand(L& l, Args... args) {
  co_return l.try_acquire(args...);
}

template <class Result, class L, class... Args>
asio::awaitable<Result> try_permit_on_strand(asio::any_io_executor strand,
                                             std::weak_ptr<void> alive, L& l, Args... args) {
  auto p = l.try_acquire(args...);
  if constexpr (is_optional<Result>::value) {
    if (!p) co_return std::nullopt;
    co_return Result(std::in_place, std::move(strand), std::move(*p), std::move(alive));
  } else {
    if (!p) co_return Result{};
    co_return Result(std::move(strand), std::move(p), std::move(alive));
  }
}

template <class R, class L, class F>
asio::awaitable<R> invoke_on_strand(L& l, F& f) {
  if constexpr (std::is_void_v<R>) {
    f(l);
    co_return;
  } else {
    co_return f(l);
  }
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_STRAND_CALLS_HPP
