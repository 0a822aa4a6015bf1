// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_GATHER_CORE_HPP
#define SLUICE_DETAIL_GATHER_CORE_HPP

// The machinery of sluice::gather / gather_with_concurrency (gather.hpp): the
// shared state of one fan-out, its workers, the join, and the variadic
// (tuple) forms built on the ranged one.

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/child_set.hpp>
#include <sluice/detail/range_holder.hpp>
#include <sluice/detail/ranges.hpp>
#include <sluice/detail/throw_error.hpp>
#include <sluice/outcome.hpp>
#include <sluice/progress.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace sluice::detail {

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
      : input(std::forward<R>(r)), children(child_set::make()), progress(std::forward<P>(p)...) {}

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
    throw_system_error(asio::error::operation_aborted, "sluice: cancelled before start");
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
  error_code ec;
  co_await s->children->join(ex, ec);
  co_await asio::this_coro::throw_if_cancelled(throw_before);
  s->progress.finish();
  if (s->first_error) std::rethrow_exception(s->first_error);
  if (ec) throw_system_error(ec, "sluice::gather");
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

// Rethrow: a failure is stored and rethrown, so that a settling fan-out with
// progress counts it in `failed` (and goes on).
template <bool Rethrow = false, class T, class Executor>
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
    if constexpr (Rethrow) throw;
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

// The last of a pack is a sluice::progress.
template <class... A>
concept ends_with_progress =
    (sizeof...(A) >= 2) &&
    is_progress_v<std::remove_cvref_t<std::tuple_element_t<sizeof...(A) - 1, std::tuple<A...>>>>;

// The one before the last of a pack is the return_exceptions tag.
template <class... A>
constexpr bool return_exceptions_before_last() {
  if constexpr (sizeof...(A) >= 3) {
    return std::is_same_v<
        std::remove_cvref_t<std::tuple_element_t<sizeof...(A) - 2, std::tuple<A...>>>,
        return_exceptions_t>;
  } else {
    return false;
  }
}

// What slot i of a variadic gather holds: the value, or settling, the outcome.
template <bool Settle, class T>
using tuple_slot_t = std::conditional_t<Settle, outcome<T>, gather_value_t<T>>;

// gather(a, b, ..., [return_exceptions,] progress): the ranged fan-out over
// the wrapped tasks reports; total is the number of tasks.
template <bool Settle, class Executor, class F, class... T, std::size_t... I>
asio::awaitable<std::tuple<tuple_slot_t<Settle, T>...>, Executor> gather_tuple_progress(
    std::index_sequence<I...>, progress<F> report, asio::awaitable<T, Executor>... tasks) {
  std::tuple<std::optional<tuple_slot_t<Settle, T>>...> slots;
  std::vector<asio::awaitable<void, Executor>> wrapped;
  wrapped.reserve(sizeof...(T));
  if constexpr (Settle) {
    (wrapped.push_back(store_outcome_into<true>(std::move(tasks), std::get<I>(slots))), ...);
  } else {
    (wrapped.push_back(store_into(std::move(tasks), std::get<I>(slots))), ...);
  }
  co_await start_gather<Settle>(unbounded, std::move(wrapped), std::move(report));
  co_return std::tuple<tuple_slot_t<Settle, T>...>(std::move(*std::get<I>(slots))...);
}

// `args`: the tasks (the first sizeof...(I)), then return_exceptions if
// Settle, then the progress (last).
template <bool Settle, class Tuple, std::size_t... I>
auto progress_tuple(Tuple&& args, std::index_sequence<I...> seq) {
  constexpr std::size_t n = std::tuple_size_v<std::remove_cvref_t<Tuple>>;
  using first = std::remove_cvref_t<std::tuple_element_t<0, std::remove_cvref_t<Tuple>>>;
  return gather_tuple_progress<Settle, task_executor_t<first>>(
      seq, std::get<n - 1>(std::move(args)), std::get<I>(std::move(args))...);
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_GATHER_CORE_HPP
