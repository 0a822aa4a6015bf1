// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_MAP_UNORDERED_HPP
#define SLUICE_MAP_UNORDERED_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/range_holder.hpp>
#include <sluice/detail/stream_core.hpp>
#include <sluice/outcome.hpp>
#include <sluice/progress.hpp>
#include <sluice/stream.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <ranges>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace sluice {

namespace detail {

// What a fan-out input yields: an async source's U, or a range's element
// (moved out of an owned range, copied from a borrowed one: range_cursor::take).
template <class In>
struct fan_out_input_traits {
  static constexpr bool valid = false;
};

template <class In>
requires async_source<std::remove_reference_t<In>>
struct fan_out_input_traits<In> {
  static constexpr bool valid = true;
  static constexpr bool is_async = true;
  using value_type = async_source_value_t<std::remove_reference_t<In>>;
};

template <class In>
requires(!async_source<std::remove_reference_t<In>> &&
         std::ranges::input_range<std::remove_reference_t<In>>) struct fan_out_input_traits<In> {
  static constexpr bool valid = true;
  static constexpr bool is_async = false;
  using value_type =
      std::remove_cvref_t<std::ranges::range_rvalue_reference_t<std::remove_reference_t<In>>>;
};

}  // namespace detail

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

namespace detail {

// What a stage yields for a task result R: R itself (void: monostate), or,
// for a filtering stage (R = std::optional<U>), U.
template <class R, bool Filter>
struct stage_value {
  using type = std::conditional_t<std::is_void_v<R>, std::monostate, R>;
};
template <class R>
struct stage_value<R, true> {
  using type = typename optional_traits<R>::value_type;
};

template <class F, class In, bool Settle, bool Filter = false>
struct map_types {
  using input_value = fan_out_input_t<In>;
  using task_type = std::invoke_result_t<F&, input_value>;
  using result_type = task_result_t<task_type>;
  using executor_type = task_executor_t<task_type>;
  using yield_type = typename stage_value<result_type, Filter>::type;
  using value_type = std::conditional_t<Settle, outcome<yield_type>, yield_type>;
};

// One map_unordered: the input, the function, and the worker coroutine. A
// worker takes a slot, pulls one input (an async source is pulled by one
// worker at a time: pulling_), awaits fn(input) inline and hands the result
// to the stream, then goes round again; no co_spawn per task.
// Filter: fn yields std::optional<U>; an empty one is dropped (its slot goes
// back at once) and U is yielded. Progress: no_progress or a progress_tracker.
template <class F, class In, bool Settle, bool Filter = false, class Progress = no_progress>
class map_core final
    : public stream_core<typename map_types<F, In, Settle, Filter>::value_type,
                         typename map_types<F, In, Settle, Filter>::executor_type> {
  using types = map_types<F, In, Settle, Filter>;
  using base = stream_core<typename types::value_type, typename types::executor_type>;
  using executor_type = typename types::executor_type;
  using input_value = typename types::input_value;
  static constexpr bool is_async = fan_out_input_traits<In>::is_async;
  using input_type = std::conditional_t<is_async, range_holder<In>, range_cursor<In>>;
  using result_type = typename types::result_type;
  using task_value = std::conditional_t<std::is_void_v<result_type>, std::monostate, result_type>;

 public:
  template <class... P>
  map_core(F fn, In&& in, std::size_t limit, P&&... p)
      : base(limit),
        fn_(std::move(fn)),
        input_(std::forward<In>(in)),
        progress_(std::forward<P>(p)...) {}

 private:
  void spawn_worker() override {
    auto self = std::static_pointer_cast<map_core>(this->shared_from_this());
    auto& children = this->children();
    children->spawn(this->executor(), work(std::move(self), children->size()));
  }

  asio::awaitable<void, executor_type> close_input() override {
    if constexpr (is_async && !std::is_reference_v<In>) {
      if constexpr (requires(std::remove_reference_t<In> & s) {
                      { s.close() } -> std::same_as<asio::awaitable<void, executor_type>>;
                    }) {
        co_await input_.get().close();
      }
    }
  }

  static asio::awaitable<void, executor_type> work(std::shared_ptr<map_core> c, std::size_t self) {
    try {
      // Start from a post, not inline in co_spawn: the spawning worker starts
      // its own task first, so tasks start in input order, and nothing runs
      // re-entrantly inside kick().
      // (The executor is named: g++ 12 may destroy co_await temporaries twice.)
      const executor_type ex = c->executor();
      asio::use_awaitable_t<executor_type> token;
      co_await asio::post(ex, token);
      c->worker_started();
      if constexpr (Progress::enabled) {
        if (!c->progress_.begun()) {
          if constexpr (is_async) {
            c->progress_.begin(ex, std::nullopt);
          } else {
            c->progress_.begin(ex, size_if_known(c->input_.range()));
          }
        }
      }
      // The input being processed (empty between tasks); one per worker,
      // not one per task.
      std::optional<input_value> input;
      while (!c->ending()) {
        // (A range is pulled inline: no other worker can be pulling it.)
        if (!(is_async ? c->may_pull() : c->has_free_slot())) {
          co_await c->park();
          c->unparked();
          continue;
        }
        c->take_slot();
        if constexpr (is_async) {
          std::exception_ptr input_error;
          c->begin_pull();
          try {
            input = co_await c->input_.get().next();
          } catch (...) {
            input_error = std::current_exception();
          }
          c->end_pull();
          if (c->ending()) {  // stopped while pulling: drop what came
            c->give_back_slot();
            break;
          }
          if (input_error) {
            // Fail fast cancels the running tasks; settling lets them finish.
            c->give_back_slot(false);
            c->fail(std::move(input_error), self, !Settle);
            break;
          }
        } else {
          // Nothing else runs while a range is pulled (no suspension), and
          // the failure is handled where it is caught: no exception_ptr per
          // task in the frame.
          try {
            if (!c->input_.done()) input.emplace(c->input_.take());
          } catch (...) {
            c->give_back_slot(false);
            c->fail(std::current_exception(), self, !Settle);
            break;
          }
        }
        if (!input) {
          c->give_back_slot(false);
          c->input_exhausted();
          break;
        }
        c->kick();  // a free slot may take the next input now
        // The task, awaited inline (no frame of ours around it).
        c->task_started();
        c->progress_.started();
        if constexpr (!Settle && !Filter && !std::is_void_v<result_type>) {
          // The common case: the result goes straight to deliver().
          try {
            result_type r = co_await std::invoke(c->fn_, std::move(*input));
            input.reset();  // the task is done: an exception now is not its
            c->task_ended();
            c->progress_.ended(false);
            c->deliver(self, std::move(r));
          } catch (...) {
            if (!input) throw;  // the machinery's, not the task's (see below)
            c->task_ended();
            c->progress_.ended(true);
            input.reset();
            c->give_back_slot(false);
            c->fail(std::current_exception(), self, true);
          }
          continue;
        }
        std::optional<task_value> value;
        try {
          if constexpr (std::is_void_v<result_type>) {
            co_await std::invoke(c->fn_, std::move(*input));
            value.emplace();
          } else {
            value.emplace(co_await std::invoke(c->fn_, std::move(*input)));
          }
        } catch (...) {
          c->task_ended();
          c->progress_.ended(true);
          input.reset();
          if constexpr (Settle) {
            c->deliver(self, std::current_exception());
          } else {
            c->give_back_slot(false);
            c->fail(std::current_exception(), self, true);
          }
          continue;
        }
        c->task_ended();
        c->progress_.ended(false);
        input.reset();
        if constexpr (Filter) {
          if (!*value) {  // dropped: its slot goes to the next input at once
            c->give_back_slot();
            continue;
          }
          c->deliver(self, std::move(**value));
        } else if constexpr (Settle && std::is_void_v<result_type>) {
          c->deliver(self);
        } else {
          c->deliver(self, std::move(*value));
        }
      }
    } catch (...) {
      // Only the machinery can get here (tasks' exceptions are caught above).
      c->fail(std::current_exception(), self, true);
    }
    if constexpr (Progress::enabled) {
      // The last worker out of a started stream makes the end report.
      if (c->progress_.begun() && c->ending() && c->last_worker()) {
        c->progress_.finish();
        if (auto e = c->progress_.error()) c->report_error(std::move(e));
      }
    }
    c->worker_left();
  }

  F fn_;
  input_type input_;
  [[no_unique_address]] Progress progress_;
};

template <bool Settle, bool Filter = false, class F, class In, class... P>
auto make_map_stream(F fn, In&& in, std::size_t limit, P&&... p) {
  if (limit == 0)
    throw std::invalid_argument(std::string(Filter ? "sluice::filter" : "sluice::map_unordered") +
                                ": limit must be at least 1 (got 0)");
  using core =
      map_core<F, In, Settle, Filter, typename tracker_for<std::remove_cvref_t<P>...>::type>;
  using types = map_types<F, In, Settle, Filter>;
  if constexpr (!fan_out_input_traits<In>::is_async) {
    static_assert(
        !lends_stored_tasks<In>,
        "sluice::as_completed / map_unordered: the input holds stored "
        "asio::awaitable<T>s and is passed as an lvalue, but an awaitable runs only once and "
        "would be moved out of it: pass std::move(tasks) (or a lazy range that makes "
        "each task when it is dereferenced).");
  }
  if constexpr (fan_out_input_traits<In>::is_async) {
    static_assert(
        std::is_same_v<
            task_executor_t<decltype(std::declval<std::remove_reference_t<In>&>().next())>,
            typename types::executor_type>,
        "sluice::map_unordered: the async source's next() and fn's tasks must use the same "
        "executor type (e.g. both asio::awaitable<...> with the default any_io_executor)");
  }
  return stream_access::make<typename types::value_type, typename types::executor_type>(
      std::make_shared<core>(std::move(fn), std::forward<In>(in), limit, std::forward<P>(p)...));
}

// as_completed's function: the element is already the task.
struct take_task {
  template <task A>
  std::remove_cvref_t<A> operator()(A&& a) const {
    return std::move(a);
  }
};

template <class>
inline constexpr bool map_unordered_misuse = false;

template <class F, class In>
void report_map_misuse() {
  if constexpr (!fan_out_input<In>) {
    static_assert(map_unordered_misuse<F>,
                  "sluice::map_unordered: `inputs` must be an input range (a container, a lazy "
                  "range) or an async source whose next() returns "
                  "asio::awaitable<std::optional<U>> (such as another sluice::stream).");
  } else {
    static_assert(
        map_unordered_misuse<F>,
        "sluice::map_unordered: `fn(input)` must be callable with one element of `inputs` "
        "and return asio::awaitable<T>: pass a coroutine function (fetch), not a task "
        "(fetch(x)); use sluice::as_completed for a range of tasks.");
  }
}

}  // namespace detail

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
