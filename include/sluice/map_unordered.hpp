// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_MAP_UNORDERED_HPP
#define SLUICE_MAP_UNORDERED_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/map_core.hpp>
#include <sluice/outcome.hpp>
#include <sluice/progress.hpp>
#include <sluice/stream.hpp>

#include <concepts>
#include <cstddef>
#include <type_traits>
#include <utility>

namespace sluice {

/// An input of `sluice::map_unordered`: an input range (it may be lazy), or an
/// asynchronous source whose `next()` returns `asio::awaitable<std::optional<U>>`
/// (another `sluice::stream`, a queue adapter, a paginated listing).
template <class In>
concept fan_out_input = detail::fan_out_input_traits<In>::valid;

/// The element type a `fan_out_input` yields.
template <fan_out_input In>
using fan_out_input_t = typename detail::fan_out_input_traits<In>::value_type;

/// A function `sluice::map_unordered` can apply to each element of `In`:
/// `fn(element)` returns an `asio::awaitable<T, Executor>`.
template <class F, class In>
concept fan_out_function = fan_out_input<In> && std::invocable<F&, fan_out_input_t<In>> &&
    task<std::invoke_result_t<F&, fan_out_input_t<In>>>;

/// Applies `fn` to every element of `inputs`, at most `limit` at a time, and
/// streams the results in completion order: asyncio's missing `imap_unordered`.
///
/// - Lazy and bounded: the returned `sluice::stream` starts nothing before its
///   first `next()`; `limit` workers then each take the next input only when a
///   slot is free. Running tasks plus results not yet read never exceed
///   `limit` (backpressure: a slow consumer stops the input, not the running
///   tasks), and the instant a slot frees the next input starts (no batches).
/// - `inputs` is an input range (lazy ones included; 10 million inputs take
///   the memory of `limit`), or an async source, which is never asked for
///   `next()` concurrently, so stages chain:
///   `map_unordered(store, map_unordered(fetch, pages, 8), 4)`.
/// - Runs on the executor of the coroutine that first calls `next()`; one
///   coroutine frame per task, no `co_spawn` per task.
/// - Fail fast: the first exception of a task (first in time) stops the
///   pulling and cancels the running siblings (terminal). Results that
///   finished before it are still yielded; then `next()` rethrows it once every
///   sibling has finished; later calls yield nothing. Exceptions of tasks that
///   were cancelled because of it are not reported.
/// - An exception thrown by the input itself (the range's iterator, the
///   source's `next()`) is a failure like a task's: fail fast stops pulling,
///   cancels the running tasks and `next()` rethrows it after they finished.
/// - Per-Operation Cancellation: see `stream::next()` (a cancelled consumer
///   cancels every task, waits, throws `operation_aborted`).
///
/// Throws `std::invalid_argument` at once, before anything starts, if
/// `limit == 0`.
///
/// Lifetimes: `fn` is moved into the stream; an rvalue input is moved in and
/// owned (an owned source with `close()` is closed by `stream::close()`); an
/// lvalue input is used in place and must outlive the stream's tasks. An
/// element is moved out of the range and into `fn`, whose task is awaited
/// before the element is destroyed.
///
/// Consume the stream with `sluice::for_each`, which waits for every task on
/// every way out (see `sluice::stream` for the hazard of a hand-written loop).
///
/// @code
/// co_await sluice::for_each(
///     sluice::map_unordered([&](std::string key) { return store.size_of(std::move(key)); },
///                           keys, 5),
///     [&](std::size_t n) { total += n; });
/// @endcode
template <class F, class In>
requires fan_out_function<F, In>
[[nodiscard]] auto map_unordered(F fn, In&& inputs, std::size_t limit) {
  return detail::make_map_stream<false>(std::move(fn), std::forward<In>(inputs), limit);
}

/// Settling `map_unordered`: nothing is cancelled when a task fails, every
/// input is processed, and each result is an `outcome<T>` (in completion
/// order; pair the input with the value in `fn` to tell which one failed).
/// An exception thrown by the input itself stops the pulling, lets the running
/// tasks finish and yields their outcomes, then is rethrown by `next()`.
/// Cancelling the consumer still cancels every running task.
///
/// @code
/// co_await sluice::for_each(sluice::map_unordered(fetch, urls, 8, sluice::return_exceptions),
///                           [&](sluice::outcome<page> r) { if (!r) log(r.error()); });
/// @endcode
template <class F, class In>
requires fan_out_function<F, In>
[[nodiscard]] auto map_unordered(F fn, In&& inputs, std::size_t limit, return_exceptions_t) {
  return detail::make_map_stream<true>(std::move(fn), std::forward<In>(inputs), limit);
}

/// `map_unordered` with progress reports (see `sluice::progress`): `report`
/// is called at most once per `every` as tasks start and finish (`done` when
/// a task finishes, not when its result is read), and once when the stream
/// ends (by its last task; also when it is closed or fails). `total` is the
/// input's size when it is a sized range.
template <class F, class In, class P>
requires fan_out_function<F, In>
[[nodiscard]] auto map_unordered(F fn, In&& inputs, std::size_t limit, progress<P> report) {
  return detail::make_map_stream<false>(std::move(fn), std::forward<In>(inputs), limit,
                                        std::move(report));
}

/// Settling `map_unordered` with progress reports.
template <class F, class In, class P>
requires fan_out_function<F, In>
[[nodiscard]] auto map_unordered(F fn, In&& inputs, std::size_t limit, return_exceptions_t,
                                 progress<P> report) {
  return detail::make_map_stream<true>(std::move(fn), std::forward<In>(inputs), limit,
                                       std::move(report));
}

/// Misuse: reports what is wrong with `fn` or `inputs` in one line.
template <class F, class In>
requires(!fan_out_function<F, In>) void map_unordered(F, In&&, std::size_t,
                                                      return_exceptions_t = return_exceptions) {
  detail::report_map_misuse<F, In>();
}

/// Runs a range (or async source) of tasks at most `limit` at a time and
/// streams their results in completion order: `map_unordered` with the
/// identity function, and asyncio's `as_completed` with a bound and lazy input.
/// Same laziness, backpressure, failure, cancellation and lifetime rules.
///
/// @code
/// std::vector<asio::awaitable<reply>> calls = make_calls();
/// co_await sluice::for_each(sluice::as_completed(std::move(calls), 4),
///                           [&](reply r) { handle(r); });
/// @endcode
template <class In>
requires fan_out_function<detail::take_task, In>
[[nodiscard]] auto as_completed(In&& tasks, std::size_t limit) {
  return detail::make_map_stream<false>(detail::take_task{}, std::forward<In>(tasks), limit);
}

/// Settling `as_completed`: every task runs; each result is an `outcome<T>`.
template <class In>
requires fan_out_function<detail::take_task, In>
[[nodiscard]] auto as_completed(In&& tasks, std::size_t limit, return_exceptions_t) {
  return detail::make_map_stream<true>(detail::take_task{}, std::forward<In>(tasks), limit);
}

/// Misuse: `tasks` must hold (or yield) `asio::awaitable<T>`.
template <class In>
requires(!fan_out_function<detail::take_task, In>) void as_completed(
    In&&, std::size_t, return_exceptions_t = return_exceptions) {
  static_assert(detail::map_unordered_misuse<In>,
                "sluice::as_completed takes a range (or async source) of asio::awaitable<T>; "
                "call your coroutine functions to make the tasks, or use sluice::map_unordered(fn, "
                "inputs, limit) to apply a function to plain inputs.");
}

}  // namespace sluice

#endif  // SLUICE_MAP_UNORDERED_HPP
