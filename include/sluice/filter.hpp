// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_FILTER_HPP
#define SLUICE_FILTER_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/outcome.hpp>
#include <sluice/progress.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <optional>
#include <type_traits>
#include <utility>

namespace sluice {

/// A function `sluice::filter` can apply to each element of `In`: `fn(element)`
/// returns `asio::awaitable<std::optional<T>>` (empty: drop the input).
template <class F, class In>
concept filter_function = fan_out_function<F, In> &&
    detail::optional_traits<task_result_t<std::invoke_result_t<F&, fan_out_input_t<In>>>>::value;

/// A stage that may drop inputs: applies `fn` to every element of `inputs`,
/// at most `limit` at a time, and streams the `T` of every engaged
/// `std::optional<T>` that `fn` returns, in completion order; an empty one
/// yields nothing.
///
/// Everything else is `sluice::map_unordered`'s: lazy, bounded (running tasks
/// plus unread results never exceed `limit`), fail fast, cancellation, lifetimes,
/// an asynchronous source as input, and it is an asynchronous source itself.
/// A dropped input gives its slot back the moment its task ends, so it never
/// waits for the consumer, and a chained next stage never sees it: it takes
/// none of that stage's slots.
///
/// Why a stage of its own and not `map_unordered` over a function returning
/// `std::optional<T>`: that already means "yield the optionals" (a lookup that
/// may find nothing, whose consumer wants to know), and code relies on it;
/// dropping them there would change what existing pipelines receive, silently.
/// The name says what the stage does.
///
/// Throws `std::invalid_argument` at once if `limit == 0`.
///
/// @code
/// auto fresh = sluice::filter([&](std::string key) -> asio::awaitable<std::optional<std::string>>
/// {
///   if (co_await cache.has(key)) co_return std::nullopt;   // dropped here
///   co_return key;
/// }, keys, 16);
/// co_await sluice::for_each(sluice::map_unordered(download, std::move(fresh), 4),
///                           [&](blob b) { store(b); });   // 4 downloads, none spent on cached
///                           keys
/// @endcode
template <class F, class In>
requires filter_function<F, In>
[[nodiscard]] auto filter(F fn, In&& inputs, std::size_t limit) {
  return detail::make_map_stream<false, true>(std::move(fn), std::forward<In>(inputs), limit);
}

/// Settling `filter`: nothing is cancelled when a task fails; each failure is
/// yielded as an `outcome<T>` holding the exception, each engaged result as
/// one holding the value; empty results are still dropped.
template <class F, class In>
requires filter_function<F, In>
[[nodiscard]] auto filter(F fn, In&& inputs, std::size_t limit, return_exceptions_t) {
  return detail::make_map_stream<true, true>(std::move(fn), std::forward<In>(inputs), limit);
}

/// `filter` with progress reports (see `sluice::progress`); a dropped input
/// counts as `done`.
template <class F, class In, class P>
requires filter_function<F, In>
[[nodiscard]] auto filter(F fn, In&& inputs, std::size_t limit, progress<P> report) {
  return detail::make_map_stream<false, true>(std::move(fn), std::forward<In>(inputs), limit,
                                              std::move(report));
}

/// Misuse: `fn(element)` must return `asio::awaitable<std::optional<T>>`.
template <class F, class In, class... Tag>
requires(!filter_function<F, In>) void filter(F, In&&, std::size_t, Tag...) {
  static_assert(detail::map_unordered_misuse<F>,
                "sluice::filter: `fn(input)` must return asio::awaitable<std::optional<T>> "
                "(std::nullopt drops the input); use sluice::map_unordered for a function that "
                "yields every result.");
}

}  // namespace sluice

#endif  // SLUICE_FILTER_HPP
