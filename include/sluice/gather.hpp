// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_GATHER_HPP
#define SLUICE_GATHER_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/gather_core.hpp>
#include <sluice/outcome.hpp>
#include <sluice/progress.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace sluice {

namespace detail {

template <class>
inline constexpr bool dependent_false = false;

}  // namespace detail

/// Runs every task of `tasks` concurrently, at most `limit` at a time, and
/// returns their results in input order.
///
/// - Bounded and lazy: `limit` workers each pull the next task only when free,
///   so the range (it may be lazy) is advanced only as slots free up, at most
///   `limit` tasks exist unfinished at a time, and the instant one finishes the
///   next starts (no batches).
/// - Runs on the awaiting coroutine's executor; no thread, no io_context.
/// - Fail fast: the first exception (first in time) stops the pulling, cancels
///   the running siblings (terminal cancellation), waits until every one of
///   them has finished, then is rethrown. Nothing runs on after the call.
/// - An exception thrown by the range itself (its iterator) is handled the same
///   way.
/// - Per-Operation Cancellation: cancelling the caller (terminal) cancels all
///   running tasks, waits for them, and throws `system_error` with
///   `asio::error::operation_aborted`.
/// - Empty input completes at once with an empty vector. `limit == 0` throws
///   `std::invalid_argument` before anything starts.
///
/// Lifetimes: an rvalue range is moved into the call; an lvalue range is used
/// in place and must outlive the awaited call. A container of stored
/// awaitables must be moved in (`std::move(tasks)`: an awaitable runs once);
/// only a lazy range that makes each task on dereference may be an lvalue.
///
/// @code
/// std::vector<asio::awaitable<place>> searches;
/// for (auto& c : categories) searches.push_back(search(c));
/// std::vector<place> found = co_await sluice::gather_with_concurrency(5, std::move(searches));
/// @endcode
template <task_range R>
[[nodiscard]] auto gather_with_concurrency(std::size_t limit, R&& tasks) {
  detail::check_limit(limit, "sluice::gather_with_concurrency");
  return detail::start_gather<false>(limit, std::forward<R>(tasks));
}

/// `gather_with_concurrency` that settles instead of failing fast: nothing is
/// cancelled when a task fails, every task runs, and slot i holds task i's
/// value or exception as an `outcome`. Cancelling the caller still cancels the
/// running tasks and throws `operation_aborted`; an exception thrown by the
/// range itself stops the pulling, lets the running tasks finish, and is
/// rethrown.
template <task_range R>
[[nodiscard]] auto gather_with_concurrency(std::size_t limit, R&& tasks, return_exceptions_t) {
  detail::check_limit(limit, "sluice::gather_with_concurrency");
  return detail::start_gather<true>(limit, std::forward<R>(tasks));
}

/// Runs every task of `tasks` concurrently (no bound) and returns their results
/// in input order; `std::vector<T>`, or nothing for `void` tasks. Same
/// fail-fast, cancellation and lifetime rules as `gather_with_concurrency`.
///
/// @code
/// auto [user, orders] = co_await sluice::gather(fetch_user(id), fetch_orders(id));
/// std::vector<int> sizes = co_await sluice::gather(std::move(size_tasks));
/// @endcode
template <task_range R>
[[nodiscard]] auto gather(R&& tasks) {
  return detail::start_gather<false>(detail::unbounded, std::forward<R>(tasks));
}

/// Settling `gather`: every task runs; each result is an `outcome<T>`.
template <task_range R>
[[nodiscard]] auto gather(R&& tasks, return_exceptions_t) {
  return detail::start_gather<true>(detail::unbounded, std::forward<R>(tasks));
}

/// `gather_with_concurrency` with progress reports: `report(const
/// sluice::progress_info&)` is called at most once per `every` while tasks
/// start and finish, and once at the end (see `sluice::progress`). `total` is
/// the range's size when it is a sized range. Otherwise as the form without.
///
/// @code
/// co_await sluice::gather_with_concurrency(8, std::move(calls), sluice::progress(print_bar));
/// @endcode
template <task_range R, class F>
[[nodiscard]] auto gather_with_concurrency(std::size_t limit, R&& tasks, progress<F> report) {
  detail::check_limit(limit, "sluice::gather_with_concurrency");
  return detail::start_gather<false>(limit, std::forward<R>(tasks), std::move(report));
}

/// Settling `gather_with_concurrency` with progress reports (`failed` counts
/// the outcomes that hold an exception).
template <task_range R, class F>
[[nodiscard]] auto gather_with_concurrency(std::size_t limit, R&& tasks, return_exceptions_t,
                                           progress<F> report) {
  detail::check_limit(limit, "sluice::gather_with_concurrency");
  return detail::start_gather<true>(limit, std::forward<R>(tasks), std::move(report));
}

/// Unbounded `gather` over a range with progress reports (see
/// `sluice::progress`). The variadic form takes one too (below).
template <task_range R, class F>
[[nodiscard]] auto gather(R&& tasks, progress<F> report) {
  return detail::start_gather<false>(detail::unbounded, std::forward<R>(tasks), std::move(report));
}

/// Settling unbounded `gather` with progress reports.
template <task_range R, class F>
[[nodiscard]] auto gather(R&& tasks, return_exceptions_t, progress<F> report) {
  return detail::start_gather<true>(detail::unbounded, std::forward<R>(tasks), std::move(report));
}

/// Runs the given tasks concurrently and returns a `std::tuple` of their
/// results (`std::monostate` for a `void` task). Fail fast as the ranged form.
template <class... T, class Executor>
requires(sizeof...(T) > 0)
    [[nodiscard]] asio::awaitable<std::tuple<detail::gather_value_t<T>...>, Executor> gather(
        asio::awaitable<T, Executor>... tasks) {
  return detail::gather_tuple<Executor>(std::index_sequence_for<T...>{}, std::move(tasks)...);
}

/// Settling variadic `gather`: `gather(a(), b(), sluice::return_exceptions)`
/// runs every task to the end and returns a `std::tuple` of `outcome`s
/// (`outcome<void>` for a `void` task). Nothing is cancelled when one fails;
/// cancelling the caller still cancels all and throws `operation_aborted`.
///
/// @code
/// auto [user, orders] = co_await sluice::gather(fetch_user(id), fetch_orders(id),
///                                               sluice::return_exceptions);
/// if (!orders) log(orders.error());
/// @endcode
template <class First, class... A>
requires task<First> && detail::ends_with_return_exceptions<First, A...>
[[nodiscard]] auto gather(First&& first, A&&... rest) {
  auto all = std::forward_as_tuple(std::forward<First>(first), std::forward<A>(rest)...);
  return detail::settle_tuple(std::move(all), std::make_index_sequence<sizeof...(A)>{});
}

/// Variadic `gather` with progress reports: `gather(a(), b(),
/// sluice::progress(report, every))`, or settling, `gather(a(), b(),
/// sluice::return_exceptions, sluice::progress(report, every))`. Returns what
/// the form without progress returns; `total` is the number of tasks, and
/// `failed` counts the tasks that threw. See `sluice::progress`.
///
/// @code
/// auto [user, orders] = co_await sluice::gather(fetch_user(id), fetch_orders(id),
///                                               sluice::progress(log_progress, 1s));
/// @endcode
template <class First, class... A>
requires task<First> && detail::ends_with_progress<First, A...>
[[nodiscard]] auto gather(First&& first, A&&... rest) {
  constexpr bool settle = detail::return_exceptions_before_last<First, A...>();
  auto all = std::forward_as_tuple(std::forward<First>(first), std::forward<A>(rest)...);
  return detail::progress_tuple<settle>(std::move(all),
                                        std::make_index_sequence<sizeof...(A) - settle>{});
}

/// Misuse: a range whose elements are not `asio::awaitable<T>`.
template <class R, class... Tag>
requires(!task_range<R> && !task<R>) void gather(R&&, Tag...) {
  static_assert(detail::dependent_false<R>,
                "sluice::gather takes a range of asio::awaitable<T> (e.g. "
                "std::vector<asio::awaitable<int>>) or awaitables as separate arguments; "
                "call your coroutine functions to make the tasks: fetch(id), not fetch or an id.");
}

/// Misuse: a range whose elements are not `asio::awaitable<T>`.
template <class R, class... Tag>
requires(!task_range<R>) void gather_with_concurrency(std::size_t, R&&, Tag...) {
  static_assert(detail::dependent_false<R>,
                "sluice::gather_with_concurrency takes a limit and a range of asio::awaitable<T> "
                "(e.g. std::vector<asio::awaitable<int>>); call your coroutine functions to make "
                "the tasks: fetch(id), not fetch or an id.");
}

}  // namespace sluice

#endif  // SLUICE_GATHER_HPP
