// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_MAP_CORE_HPP
#define SLUICE_DETAIL_MAP_CORE_HPP

// The machinery of sluice::map_unordered / as_completed / filter: what an
// input yields (fan_out_input_traits), the worker loop over a stream_core
// (map_core), and make_map_stream, which checks the arguments and makes the
// stream. The public functions and concepts are in map_unordered.hpp.

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/range_holder.hpp>
#include <sluice/detail/ranges.hpp>
#include <sluice/detail/stream_core.hpp>
#include <sluice/detail/throw_error.hpp>
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
#include <type_traits>
#include <utility>
#include <variant>

namespace sluice::detail {

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
  using input_value = typename fan_out_input_traits<In>::value_type;
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
      co_await c->hop();
      const executor_type ex = c->executor();
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
  check_limit(limit, Filter ? "sluice::filter" : "sluice::map_unordered");
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
  if constexpr (!fan_out_input_traits<In>::valid) {
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

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_MAP_CORE_HPP
