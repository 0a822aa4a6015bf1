// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_ALL_STRAND_BUDGET_HPP
#define SLUICE_DETAIL_ALL_STRAND_BUDGET_HPP

// A strand_bound<L> as a budget of sluice::acquire_all: L's own loop-affine
// budget (detail/all_budgets.hpp), each step of it run on L's strand through
// strand_bound's hop. A try is one round trip to the strand that takes there
// at once or takes nothing (a rate limiter is peeked and taken in one step on
// its strand); a wait is L's own FIFO wait on the strand; a grant is given
// back by a post to the strand. strand_bound itself need only be complete
// where a budget is used (its users include strand_bound.hpp).

#include <sluice/config.hpp>
#include <sluice/detail/all_budgets.hpp>
#include <sluice/detail/strand_calls.hpp>
#include <sluice/detail/strand_permit.hpp>

#include <sluice/detail/asio.hpp>

#include <memory>
#include <optional>
#include <utility>

namespace sluice::detail {

struct strand_access {
  template <class R, class L, class Make, class PassOn>
  static asio::awaitable<R> call(strand_bound<L>& b, Make make, PassOn pass_on) {
    return b.template call<R>(std::move(make), std::move(pass_on));
  }
  template <class L>
  static std::weak_ptr<strand_state<L>> weak(const strand_bound<L>& b) noexcept {
    return b.weak();
  }
};

template <class L, class Inner>
struct strand_budget {
  static constexpr budget_kind kind = budget_kind::take_async;
  strand_bound<L>* b;
  Inner inner;  // L's own budget: used on the strand only
  using held = strand_permit<typename Inner::held>;

  budget_id id() const { return inner.id(); }

  // Takes at once on the strand, or nothing.
  asio::awaitable<std::optional<held>> try_take() const {
    auto make = [w = strand_access::weak(*b), inner = inner] {
      return try_on(lock_state(w)->strand, w, inner);
    };
    return strand_access::call<std::optional<held>>(*b, std::move(make), [](std::optional<held> h) {
      if (h) undo(*h);
    });
  }
  // Waits in L's own FIFO on the strand; takes at the grant.
  asio::awaitable<held> wait_take() const {
    auto make = [w = strand_access::weak(*b), inner = inner] {
      return wait_on(lock_state(w)->strand, w, inner);
    };
    return strand_access::call<held>(*b, std::move(make), [](held h) { give_back(h); });
  }
  static void give_back(held& h) {
    h.release_with([](typename Inner::held& p) { Inner::give_back(p); });
  }
  static void undo(held& h) {
    h.release_with([](typename Inner::held& p) { Inner::undo(p); });
  }

 private:
  static asio::awaitable<std::optional<held>> try_on(asio::any_io_executor strand,
                                                     std::weak_ptr<void> alive, Inner inner) {
    std::optional<held> out;
    if constexpr (Inner::kind == budget_kind::peek) {
      if (inner.ready(strand)) out.emplace(strand, inner.take(strand), std::move(alive));
    } else {
      if (auto h = inner.try_take(strand)) out.emplace(strand, std::move(*h), std::move(alive));
    }
    co_return out;
  }
  static asio::awaitable<held> wait_on(asio::any_io_executor strand, std::weak_ptr<void> alive,
                                       Inner inner) {
    auto h = co_await inner.wait_take();
    co_return held(std::move(strand), std::move(h), std::move(alive));
  }
};

template <class L>
requires requires(L& l) {
  make_budget(l);
}
auto make_budget(strand_bound<L>& b) {
  using inner = decltype(make_budget(b.underlying()));
  return strand_budget<L, inner>{&b, make_budget(b.underlying())};
}
template <class L>
auto make_budget(strand_units<L> u) {
  auto inner = make_budget(u.bound->underlying());
  inner.n = u.n;
  return strand_budget<L, decltype(inner)>{u.bound, std::move(inner)};
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_ALL_STRAND_BUDGET_HPP
