// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_GATHER_HPP
#define SLUICE_GATHER_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/child_set.hpp>
#include <sluice/detail/range_holder.hpp>
#include <sluice/outcome.hpp>
#include <sluice/progress.hpp>

#include <sluice/detail/asio.hpp>

#include <algorithm>
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

template <class T>
using gather_value_t = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

// The result of a ranged gather: vector<T> (void: nothing), or
// vector<outcome<T>> when settling.
template <class T, bool Settle>
using gather_result_t =
    std::conditional_t<Settle, std::vector<outcome<T>>,
                       std::conditional_t<std::is_void_v<T>, void, std::vector<T>>>;

// One bounded fan-out over a range, shared by its workers.
// Invariants: results.size() == pulled; slot i is filled when task i ends;
// first_error is the first failure in time (never set by the aftermath of a
// cancelled parent).
// Results of a fail-fast gather whose T is default constructible go straight
// into the vector that is returned (no optional per slot, no second copy).
template <class R, bool Settle, class Progress = no_progress>
struct gather_state {
  using task_type = std::ranges::range_value_t<std::remove_reference_t<R>>;
  using value_type = task_result_t<task_type>;
  using slot_type = std::conditional_t<Settle, outcome<value_type>, gather_value_t<value_type>>;
  static constexpr bool settle = Settle;
  static constexpr bool store_results = Settle || !std::is_void_v<value_type>;
  static constexpr bool direct_results = !Settle && !std::is_void_v<value_type> &&
                                         std::is_default_constructible_v<slot_type> &&
                                         std::is_move_assignable_v<slot_type>;
  using results_type = std::conditional_t<direct_results, std::vector<slot_type>,
                                          std::vector<std::optional<slot_type>>>;

  using progress_type = Progress;

  template <class... P>
  explicit gather_state(R&& r, P&&... p)
      : input(std::forward<R>(r)),
        children(std::make_shared<child_set>()),
        progress(std::forward<P>(p)...) {}

  void fail(std::exception_ptr e, std::size_t worker) {
    if (!first_error && !children->parent_cancelled()) first_error = std::move(e);
    children->cancel_all(worker);
  }

  template <class... V>
  void store(std::size_t index, V&&... v) {
    if constexpr (direct_results)
      results[index] = slot_type(std::forward<V>(v)...);
    else
      results[index].emplace(std::forward<V>(v)...);
  }

  range_cursor<R> input;
  std::shared_ptr<child_set> children;
  results_type results;
  std::size_t pulled = 0;
  std::exception_ptr first_error;
  [[no_unique_address]] Progress progress;
};

// Moves the next task into `task` and its index into `index`; false when the
// input is exhausted, the fan-out is stopping, or the input itself threw
// (recorded as a failure: fail fast cancels the running tasks, settling lets
// them finish).
template <class State>
[[gnu::always_inline]] inline bool pull(State& s, std::size_t self, typename State::task_type& task,
                                        std::size_t& index) {
  if (s.children->stopping()) return false;
  try {
    if (s.input.done()) return false;
    task = s.input.take();  // may throw: nothing counted yet
    index = s.pulled++;
    if constexpr (State::store_results) s.results.emplace_back();
    s.progress.started();
    return true;
  } catch (...) {
    if (!s.first_error) s.first_error = std::current_exception();
    s.children->cancel_all(
        self, State::settle ? asio::cancellation_type::none : asio::cancellation_type::terminal);
    return false;
  }
}

// A worker awaits its task inline, then pulls the next one only when it is
// free: a task costs about as much as a sequential co_await, not a co_spawn.
template <class State, class Executor>
asio::awaitable<void, Executor> gather_worker(std::shared_ptr<State> s, std::size_t self,
                                              typename State::task_type task, std::size_t index) {
  do {
    try {
      if constexpr (std::is_void_v<typename State::value_type>) {
        co_await std::move(task);
        if constexpr (State::settle) s->store(index);
      } else {
        auto value = co_await std::move(task);
        s->store(index, std::move(value));
      }
      s->progress.ended(false, 0, false);  // reported by the next pull (or below)
    } catch (...) {
      s->progress.ended(true, 0, false);
      if constexpr (State::settle) {
        s->store(index, std::current_exception());
      } else {
        s->fail(std::current_exception(), self);
      }
    }
  } while (pull(*s, self, task, index));
  s->progress.tick();
}

// The limit of an unbounded gather.
inline constexpr std::size_t unbounded = std::numeric_limits<std::size_t>::max();

template <class State>
using state_executor_t = task_executor_t<typename State::task_type>;

template <class State>
using state_result_t = gather_result_t<typename State::value_type, State::settle>;

// Runs a fan-out whose state (and so its input) was made by the caller. The
// parent hands each new worker its first task, so workers = min(limit, tasks)
// without knowing the input's size.
template <class State>
asio::awaitable<state_result_t<State>, state_executor_t<State>> run_gather(std::shared_ptr<State> s,
                                                                           std::size_t limit) {
  using executor_type = state_executor_t<State>;
  using result_type = state_result_t<State>;

  // A caller cancelled before the call starts nothing (also with
  // throw_if_cancelled(false), where Asio itself would not throw).
  const auto caller = co_await asio::this_coro::cancellation_state;
  if (caller.cancelled() != asio::cancellation_type::none)
    throw system_error(asio::error::operation_aborted, "sluice: cancelled before start");
  auto ex = co_await asio::this_coro::executor;
  if constexpr (State::progress_type::enabled) {
    s->progress.begin(ex, size_if_known(s->input.range()));
    if (s->input.done()) {
      s->progress.finish();
      if (auto e = s->progress.error()) std::rethrow_exception(e);
      co_return result_type();
    }
  }
  if (s->input.done()) co_return result_type();

  typename State::task_type task;
  std::size_t index = 0;
  // A task that cancels the caller while it is being started (inline) stops
  // the starting too.
  while (s->children->size() < limit && caller.cancelled() == asio::cancellation_type::none &&
         pull(*s, child_set::none, task, index))
    s->children->spawn(
        ex, gather_worker<State, executor_type>(s, s->children->size(), std::move(task), index));

  // The join runs to the end even for a caller cancelled meanwhile: a task
  // may have cancelled it while it was being started (inline), and then no
  // cancellation handler of the join saw the request, so it is passed on here.
  const bool throw_before = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  if (caller.cancelled() != asio::cancellation_type::none) s->children->cancel_from_parent();
  // The token is a named local: g++ 12 may destroy a co_await operand's
  // brace-initialised temporaries twice.
  error_code ec;
  auto join_token = asio::redirect_error(asio::use_awaitable_t<executor_type>(), ec);
  co_await s->children->async_join(ex, join_token);
  co_await asio::this_coro::throw_if_cancelled(throw_before);
  s->progress.finish();
  if (s->first_error) std::rethrow_exception(s->first_error);
  if (ec) throw system_error(ec, "sluice::gather");
  if (auto e = s->children->escaped()) std::rethrow_exception(e);
  if constexpr (State::progress_type::enabled) {
    if (auto e = s->progress.error()) std::rethrow_exception(e);
  }

  if constexpr (State::direct_results) {
    co_return std::move(s->results);
  } else if constexpr (!std::is_void_v<result_type>) {
    result_type out;
    out.reserve(s->results.size());
    for (auto& slot : s->results) out.push_back(std::move(*slot));
    co_return out;
  }
}

// Takes the range into a new state now (not when the call is first awaited)
// and returns the awaitable call.
template <bool Settle, class R, class... P>
auto start_gather(std::size_t limit, R&& r, P&&... p) {
  static_assert(
      !lends_stored_tasks<R>,
      "sluice::gather / gather_with_concurrency: `tasks` holds stored "
      "asio::awaitable<T>s and is passed as an lvalue, but an awaitable runs only once and "
      "would be moved out of it: pass std::move(tasks) (or a lazy range that makes each "
      "task when it is dereferenced).");
  using state = gather_state<R, Settle, typename tracker_for<std::remove_cvref_t<P>...>::type>;
  auto s = std::make_shared<state>(std::forward<R>(r), std::forward<P>(p)...);
  if constexpr (state::store_results && std::ranges::sized_range<std::remove_reference_t<R>>)
    s->results.reserve(static_cast<std::size_t>(std::ranges::size(s->input.range())));
  return run_gather(std::move(s), limit);
}

inline void check_limit(std::size_t limit, const char* who) {
  if (limit == 0)
    throw std::invalid_argument(std::string(who) + ": limit must be at least 1 (got 0)");
}

template <class T, class Executor>
asio::awaitable<void, Executor> store_into(asio::awaitable<T, Executor> task,
                                           std::optional<gather_value_t<T>>& slot) {
  if constexpr (std::is_void_v<T>) {
    co_await std::move(task);
    slot.emplace();
  } else {
    slot.emplace(co_await std::move(task));
  }
}

template <class Executor, class... T, std::size_t... I>
asio::awaitable<std::tuple<gather_value_t<T>...>, Executor> gather_tuple(
    std::index_sequence<I...>, asio::awaitable<T, Executor>... tasks) {
  std::tuple<std::optional<gather_value_t<T>>...> slots;
  std::vector<asio::awaitable<void, Executor>> wrapped;
  wrapped.reserve(sizeof...(T));
  (wrapped.push_back(store_into(std::move(tasks), std::get<I>(slots))), ...);
  co_await start_gather<false>(unbounded, std::move(wrapped));
  co_return std::tuple<gather_value_t<T>...>(std::move(*std::get<I>(slots))...);
}

template <class T, class Executor>
asio::awaitable<void, Executor> store_outcome_into(asio::awaitable<T, Executor> task,
                                                   std::optional<outcome<T>>& slot) {
  try {
    if constexpr (std::is_void_v<T>) {
      co_await std::move(task);
      slot.emplace();
    } else {
      slot.emplace(co_await std::move(task));
    }
  } catch (...) {
    slot.emplace(std::current_exception());
  }
}

template <class Executor, class... T, std::size_t... I>
asio::awaitable<std::tuple<outcome<T>...>, Executor> gather_tuple_settled(
    std::index_sequence<I...>, asio::awaitable<T, Executor>... tasks) {
  std::tuple<std::optional<outcome<T>>...> slots;
  std::vector<asio::awaitable<void, Executor>> wrapped;
  wrapped.reserve(sizeof...(T));
  (wrapped.push_back(store_outcome_into(std::move(tasks), std::get<I>(slots))), ...);
  co_await start_gather<false>(unbounded, std::move(wrapped));
  co_return std::tuple<outcome<T>...>(std::move(*std::get<I>(slots))...);
}

// The last of a pack is the return_exceptions tag.
template <class... A>
concept ends_with_return_exceptions =
    (sizeof...(A) >= 2) &&
    std::is_same_v<std::remove_cvref_t<std::tuple_element_t<sizeof...(A) - 1, std::tuple<A...>>>,
                   return_exceptions_t>;

template <class Tuple, std::size_t... I>
auto settle_tuple(Tuple&& args, std::index_sequence<I...> seq) {
  using first = std::remove_cvref_t<std::tuple_element_t<0, std::remove_cvref_t<Tuple>>>;
  return gather_tuple_settled<task_executor_t<first>>(seq, std::move(std::get<I>(args))...);
}

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
/// `sluice::progress`). The tuple form takes none.
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
