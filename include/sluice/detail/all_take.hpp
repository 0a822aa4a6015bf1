// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_ALL_TAKE_HPP
#define SLUICE_DETAIL_ALL_TAKE_HPP

// How sluice::acquire_all takes its budgets: all now or none (take_all_now),
// or wait on one in its own FIFO and take the rest at its grant
// (wait_then_take). Parts taken are given back exactly on every way out that
// does not hand them to the caller (parts_guard).

#include <sluice/config.hpp>
#include <sluice/detail/all_budgets.hpp>

#include <sluice/detail/asio.hpp>

#include <array>
#include <cstddef>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace sluice::detail {

inline constexpr std::size_t all_taken = static_cast<std::size_t>(-1);

template <class Budget>
inline constexpr budget_kind kind_of = std::remove_cvref_t<Budget>::kind;

inline void refuse_if_cancelled(const asio::cancellation_state& cs) {
  if (cs.cancelled() != asio::cancellation_type::none)
    throw system_error(asio::error::operation_aborted, "sluice::acquire_all");
}

// Gives every part taken back (undo: uncounted), but `skip`.
template <class Budgets, class Parts, std::size_t... I>
void undo_parts(const Budgets&, Parts& parts, std::size_t skip, std::index_sequence<I...>) {
  const auto undo = [&](auto index) {
    constexpr std::size_t i = decltype(index)::value;
    auto& part = std::get<i>(parts);
    if (i == skip || !part) return;
    std::remove_cvref_t<std::tuple_element_t<i, Budgets>>::undo(*part);
    part.reset();
  };
  (undo(std::integral_constant<std::size_t, I>{}), ...);
}

// Until dismissed, gives every part back when the call ends (an exception,
// a cancellation, the loop's end).
template <class Budgets, class Parts>
struct parts_guard {
  const Budgets& bs;
  Parts& parts;
  bool armed = true;
  ~parts_guard() {
    if (armed)
      undo_parts(bs, parts, all_taken, std::make_index_sequence<std::tuple_size_v<Budgets>>{});
  }
};

// Budget I, when it lives on a strand of its own (and is not `skip`): taken
// there at once, or nothing. True when taken or not such a budget.
template <std::size_t I, class Budgets, class Parts>
asio::awaitable<bool> try_take_async(const Budgets& bs, Parts& parts, std::size_t skip) {
  const auto& b = std::get<I>(bs);
  if constexpr (kind_of<decltype(b)> == budget_kind::take_async) {
    if (I != skip) {
      auto h = co_await b.try_take();
      if (!h) co_return false;
      std::get<I>(parts).emplace(std::move(*h));
    }
  }
  co_return true;
}

// Takes every budget but `skip` now, or none. Limits on strands of their own
// first (one round trip each, in order), then the loop-affine permits (each
// given back if a later budget is not free), then the rate budgets, all
// peeked before any is taken: what is on the caller's own thread is taken in
// one instant. Returns all_taken, or the index of the first budget not free.
template <class Budgets, class Parts, std::size_t... I>
asio::awaitable<std::size_t> take_all_now(const Budgets& bs, Parts& parts,
                                          const asio::any_io_executor& ex, std::size_t skip,
                                          std::index_sequence<I...> seq) {
  std::size_t failed = all_taken;
  if constexpr (((kind_of<std::tuple_element_t<I, Budgets>> == budget_kind::take_async) || ...)) {
    using try_fn = asio::awaitable<bool> (*)(const Budgets&, Parts&, std::size_t);
    static constexpr std::array<try_fn, sizeof...(I)> tries{&try_take_async<I, Budgets, Parts>...};
    for (std::size_t i = 0; i < tries.size() && failed == all_taken; ++i)
      if (!co_await tries[i](bs, parts, skip)) failed = i;
  }
  const auto try_permit = [&](auto index) {
    constexpr std::size_t i = decltype(index)::value;
    const auto& b = std::get<i>(bs);
    if constexpr (kind_of<decltype(b)> == budget_kind::take_now) {
      if (failed != all_taken || i == skip) return;
      if (auto h = b.try_take(ex)) {
        std::get<i>(parts).emplace(std::move(*h));
      } else {
        failed = i;
      }
    }
  };
  const auto peek_rate = [&](auto index) {
    constexpr std::size_t i = decltype(index)::value;
    const auto& b = std::get<i>(bs);
    if constexpr (kind_of<decltype(b)> == budget_kind::peek) {
      if (failed == all_taken && i != skip && !b.ready(ex)) failed = i;
    }
  };
  (try_permit(std::integral_constant<std::size_t, I>{}), ...);
  (peek_rate(std::integral_constant<std::size_t, I>{}), ...);
  if (failed != all_taken) {
    undo_parts(bs, parts, skip, seq);
    co_return failed;
  }
  const auto take_rate = [&](auto index) {
    constexpr std::size_t i = decltype(index)::value;
    const auto& b = std::get<i>(bs);
    if constexpr (kind_of<decltype(b)> == budget_kind::peek) {
      if (i != skip) std::get<i>(parts).emplace(b.take(ex));
    }
  };
  (take_rate(std::integral_constant<std::size_t, I>{}), ...);
  co_return all_taken;
}

// Waits for budget I in its own FIFO (taking it at its grant), then takes the
// rest at that instant; if they are not all free, gives I back. True when
// everything is held. A cancellation that arrives meanwhile gives I back and
// throws operation_aborted.
template <std::size_t I, class Budgets, class Parts>
asio::awaitable<bool> wait_then_take(const Budgets& bs, Parts& parts,
                                     const asio::any_io_executor& ex,
                                     const asio::cancellation_state& cs) {
  using budget = std::remove_cvref_t<std::tuple_element_t<I, Budgets>>;
  auto h = co_await std::get<I>(bs).wait_take();
  std::size_t failed = 0;
  try {
    refuse_if_cancelled(cs);
    failed = co_await take_all_now(bs, parts, ex, I,
                                   std::make_index_sequence<std::tuple_size_v<Budgets>>{});
  } catch (...) {
    budget::give_back(h);
    throw;
  }
  if (failed == all_taken) {
    std::get<I>(parts).emplace(std::move(h));
    co_return true;
  }
  budget::give_back(h);
  co_return false;
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_ALL_TAKE_HPP
