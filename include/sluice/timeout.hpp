// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TIMEOUT_HPP
#define SLUICE_TIMEOUT_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/aborted.hpp>
#include <sluice/detail/child_set.hpp>
#include <sluice/detail/range_holder.hpp>
#include <sluice/detail/ranges.hpp>
#include <sluice/gather.hpp>
#include <sluice/outcome.hpp>
#include <sluice/time.hpp>

#include <sluice/detail/asio.hpp>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace sluice {

namespace detail {

// "<what> <d> s", d in seconds with three decimals: the message of every
// sluice error that carries a duration (timeout_error, breaker_open_error).
inline std::string seconds_message(const char* what, clock::duration d) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%s %.3f s", what, std::chrono::duration<double>(d).count());
  return buf;
}

}  // namespace detail

/// Thrown by `with_timeout` when its own deadline passed, and stored in the
/// `outcome` of every slot a `deadline` left unfinished.
///
/// Derives from `std::runtime_error`, deliberately not from `system_error`:
/// a `catch (const sluice::system_error&)` written for `operation_aborted`
/// (the caller's own cancellation) never swallows a timeout, and the two can
/// be told apart by type alone.
class timeout_error : public std::runtime_error {
 public:
  /// A timeout after `limit` (any duration, saturated); the message states it
  /// in seconds.
  explicit timeout_error(saturating_duration limit)
      : std::runtime_error(detail::seconds_message("sluice: timed out after", limit)),
        limit_(limit) {}

  /// The time limit that passed.
  [[nodiscard]] clock::duration limit() const noexcept { return limit_; }

 private:
  clock::duration limit_;
};

namespace detail {

// What a race between a body and a deadline saw. Invariant: expired is set
// only if the deadline passed while the body was still running.
struct race_state {
  bool expired = false;
  bool body_done = false;
  std::exception_ptr error;  // the body's exception, if any
};

inline constexpr std::size_t race_timer_child = 0;
inline constexpr std::size_t race_body_child = 1;

template <class Executor>
asio::awaitable<void, Executor> race_timer(Executor ex, clock::time_point deadline,
                                           std::shared_ptr<child_set> children,
                                           std::shared_ptr<race_state> st) {
  try {
    co_await wait_until(ex, find_virtual_clock(ex), deadline);
  } catch (...) {
    co_return;  // the body finished first (or the caller was cancelled)
  }
  if (st->body_done) co_return;  // both at the same instant: the body wins
  st->expired = true;
  children->cancel(race_body_child);
}

template <class Executor>
asio::awaitable<void, Executor> race_body(asio::awaitable<void, Executor> body,
                                          std::shared_ptr<child_set> children,
                                          std::shared_ptr<race_state> st) {
  try {
    co_await std::move(body);
  } catch (...) {
    st->error = std::current_exception();
  }
  st->body_done = true;
  children->cancel(race_timer_child);  // the timer is gone at once
}

// Runs `body` against a deadline: two children of one child_set, whichever
// ends first cancels the other (terminal), and both are awaited. The timer
// starts first, so it is waiting before the body runs. Cancelling the caller
// cancels both, waits for both, and throws operation_aborted (also when the
// deadline had passed too). A caller cancelled before the call starts nothing.
template <class Executor>
asio::awaitable<void, Executor> run_until(asio::awaitable<void, Executor> body,
                                          clock::time_point deadline,
                                          std::shared_ptr<race_state> st) {
  const auto caller = co_await asio::this_coro::cancellation_state;
  if (caller.cancelled() != asio::cancellation_type::none)
    throw system_error(asio::error::operation_aborted, "sluice: cancelled before start");
  auto ex = co_await asio::this_coro::executor;
  auto children = child_set::make();
  children->spawn(ex, race_timer<Executor>(ex, deadline, children, st));
  children->spawn(ex, race_body<Executor>(std::move(body), children, st));
  // The join must run to the end even for a caller cancelled meanwhile. The
  // body ran inline up to its first suspension and may have cancelled the
  // caller there, before any handler of the join could see it: passed on here.
  const bool throw_before = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  if (caller.cancelled() != asio::cancellation_type::none) children->cancel_from_parent();
  error_code ec;
  auto join_token = asio::redirect_error(asio::use_awaitable_t<Executor>(), ec);
  co_await children->async_join(ex, join_token);
  co_await asio::this_coro::throw_if_cancelled(throw_before);
  if (ec) throw system_error(ec, "sluice::with_timeout");
}

template <class Executor>
clock::time_point deadline_after(const Executor& ex, clock::duration d) {
  // Saturate instead of overflowing for "forever" budgets.
  return add_saturating(sluice::now(ex), d);
}

}  // namespace detail

/// Awaits `op` for at most `limit` (on the clock of the awaiting coroutine's
/// executor: virtual under `sluice::testing::virtual_loop`, exact there).
///
/// - `op` finishing first (value or exception) ends the call at once; its
///   timer is cancelled at that moment, nothing is left pending.
/// - On its own deadline it cancels `op` (terminal), waits until `op` has
///   finished, and throws `sluice::timeout_error`. An `op` that ignores the
///   cancellation and still returns a value, however late, keeps it: the
///   value is returned and no `timeout_error` is thrown (as asyncio's
///   `timeout()` does); check the elapsed time yourself if a late value is
///   useless to you. An exception other than `operation_aborted` that `op`
///   throws while being cancelled passes through unchanged.
/// - Per-Operation Cancellation: cancelling the caller cancels `op`, waits for
///   it, and throws `system_error(operation_aborted)`, never `timeout_error`.
///   A caller cancelled before the call does not start `op`; one cancelled
///   by `op` itself while it starts (inline, before its first suspension) is
///   seen at once too.
/// - Nested timeouts: each reports only its own deadline; an inner
///   `timeout_error` passes through the outer call as any other exception.
/// - Runs `op` as a child coroutine on the caller's executor; `op` must not
///   outlive what it references (it never outlives the call).
/// - `limit`: any `std::chrono::duration`, saturated instead of overflowing
///   (`std::chrono::hours::max()` or a thousand years means no deadline).
///
/// @code
/// try {
///   profile p = co_await sluice::with_timeout(std::chrono::seconds(2), fetch_profile(id));
/// } catch (const sluice::timeout_error&) {
///   // fetch_profile was cancelled and has finished
/// }
/// @endcode
template <class Rep, class Period, class T, class Executor>
[[nodiscard]] asio::awaitable<T, Executor> with_timeout(std::chrono::duration<Rep, Period> d,
                                                        asio::awaitable<T, Executor> op) {
  const clock::duration limit = detail::saturate(d);
  auto ex = co_await asio::this_coro::executor;
  const clock::time_point deadline = detail::deadline_after(ex, limit);
  std::optional<detail::gather_value_t<T>> slot;
  auto st = std::make_shared<detail::race_state>();
  co_await detail::run_until<Executor>(detail::store_into(std::move(op), slot), deadline, st);
  if (slot) {
    if constexpr (std::is_void_v<T>) {
      co_return;
    } else {
      co_return std::move(*slot);
    }
  }
  if (st->error && !(st->expired && detail::is_operation_aborted(st->error)))
    std::rethrow_exception(st->error);
  throw timeout_error(limit);
}

/// Tag type of `sluice::deadline`.
struct deadline_t {
  clock::duration limit;  ///< the time limit, counted from the first `co_await` of the call
};

/// A time limit for a settling fan-out that keeps what finished:
/// `sluice::gather(tasks, sluice::return_exceptions, sluice::deadline(3s))`.
/// The limit counts from when the call is first awaited.
template <class Rep, class Period>
[[nodiscard]] constexpr deadline_t deadline(std::chrono::duration<Rep, Period> limit) noexcept {
  return deadline_t{detail::saturate(limit)};
}

namespace detail {

// One settling fan-out under a deadline. Invariant: slots.size() == inputs
// taken so far; slot i is filled when task i ends.
template <class R>
struct deadline_gather_state {
  using task_type = std::ranges::range_value_t<std::remove_reference_t<R>>;
  using value_type = task_result_t<task_type>;
  using executor_type = task_executor_t<task_type>;

  deadline_gather_state(R&& r, clock::duration d) : input(std::forward<R>(r)), limit(d) {}

  range_cursor<R> input;
  clock::duration limit;
  std::vector<std::optional<outcome<value_type>>> slots;
  std::shared_ptr<race_state> race = std::make_shared<race_state>();
};

template <class State>
asio::awaitable<void, typename State::executor_type> settle_slot(std::shared_ptr<State> s,
                                                                 std::size_t i,
                                                                 typename State::task_type task) {
  try {
    if constexpr (std::is_void_v<typename State::value_type>) {
      co_await std::move(task);
      s->slots[i].emplace();
    } else {
      auto value = co_await std::move(task);
      s->slots[i].emplace(std::move(value));
    }
  } catch (...) {
    auto e = std::current_exception();
    if (s->race->expired && is_operation_aborted(e))
      e = std::make_exception_ptr(timeout_error(s->limit));
    s->slots[i].emplace(std::move(e));
  }
}

// The input seen through a slot per element: dereferencing takes the next
// task and returns the coroutine that settles it into its slot. Each element
// is dereferenced exactly once, then incremented (as range_cursor does);
// ++ itself does nothing.
template <class State>
class settle_range {
 public:
  class iterator {
   public:
    using value_type = asio::awaitable<void, typename State::executor_type>;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    explicit iterator(std::shared_ptr<State> s) : s_(std::move(s)) {}
    value_type operator*() const {
      auto task = s_->input.take();  // may throw: no slot taken yet
      s_->slots.emplace_back();
      return settle_slot(s_, s_->slots.size() - 1, std::move(task));
    }
    iterator& operator++() { return *this; }
    void operator++(int) {}
    friend bool operator==(const iterator& it, std::default_sentinel_t) {
      return it.s_->input.done();
    }

   private:
    std::shared_ptr<State> s_;
  };

  explicit settle_range(std::shared_ptr<State> s) : s_(std::move(s)) {}
  iterator begin() const { return iterator(s_); }
  std::default_sentinel_t end() const { return {}; }

 private:
  std::shared_ptr<State> s_;
};

template <class State>
asio::awaitable<std::vector<outcome<typename State::value_type>>, typename State::executor_type>
run_deadline_gather(std::shared_ptr<State> s, std::size_t limit) {
  using executor_type = typename State::executor_type;
  auto ex = co_await asio::this_coro::executor;
  const clock::time_point deadline = deadline_after(ex, s->limit);
  co_await run_until<executor_type>(start_gather<false>(limit, settle_range<State>(s)), deadline,
                                    s->race);
  const race_state& race = *s->race;
  if (race.error && !(race.expired && is_operation_aborted(race.error)))
    std::rethrow_exception(race.error);  // the input range itself threw
  // Inputs not started by the deadline: taken (never started) and timed out.
  if (race.expired) {
    while (!s->input.done()) {
      { auto never_started = s->input.take(); }
      s->slots.emplace_back(std::make_exception_ptr(timeout_error(s->limit)));
    }
  }
  std::vector<outcome<typename State::value_type>> out;
  out.reserve(s->slots.size());
  for (auto& slot : s->slots) {
    // Empty only for a task whose worker never started before the deadline.
    if (!slot) slot.emplace(std::make_exception_ptr(timeout_error(s->limit)));
    out.push_back(std::move(*slot));
  }
  co_return out;
}

template <class R>
auto start_deadline_gather(std::size_t limit, R&& r, clock::duration d) {
  auto s = std::make_shared<deadline_gather_state<R>>(std::forward<R>(r), d);
  return run_deadline_gather(std::move(s), limit);
}

}  // namespace detail

/// Settling `gather` under a deadline that keeps what finished: every task
/// starts at once; when `d.limit` has passed (counted from the first
/// `co_await` of the call), the tasks still running are cancelled (terminal)
/// and awaited, and the call returns one `outcome` per input in input order:
/// the value or exception of each task that finished, `sluice::timeout_error`
/// for each one that had not. A task that still returns a value after the
/// cancellation keeps it; an `operation_aborted` it throws then becomes
/// `timeout_error`. Nothing runs after the call returns.
///
/// Per-Operation Cancellation: cancelling the caller cancels every task, waits,
/// and throws `operation_aborted` (results are dropped). An exception thrown
/// by the input range itself is rethrown after the running tasks stopped.
/// Lifetimes as for `gather`.
///
/// @code
/// auto results = co_await sluice::gather(std::move(calls), sluice::return_exceptions,
///                                        sluice::deadline(std::chrono::seconds(3)));
/// for (auto& r : results)
///   if (r) use(*r); else if (timed_out(r.error())) retry_later();
/// @endcode
template <task_range R>
[[nodiscard]] auto gather(R&& tasks, return_exceptions_t, deadline_t d) {
  return detail::start_deadline_gather(std::numeric_limits<std::size_t>::max(),
                                       std::forward<R>(tasks), d.limit);
}

/// Settling `gather_with_concurrency` under a deadline that keeps what
/// finished (see the `gather` overload above). Inputs not yet started when the
/// deadline passes are never started: they are taken from the range (an
/// endless range never ends here) and their slots hold `timeout_error`.
/// `limit == 0` throws `std::invalid_argument` before anything starts.
template <task_range R>
[[nodiscard]] auto gather_with_concurrency(std::size_t limit, R&& tasks, return_exceptions_t,
                                           deadline_t d) {
  detail::check_limit(limit, "sluice::gather_with_concurrency");
  return detail::start_deadline_gather(limit, std::forward<R>(tasks), d.limit);
}

}  // namespace sluice

#endif  // SLUICE_TIMEOUT_HPP
