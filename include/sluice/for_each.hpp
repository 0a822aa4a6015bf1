// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_FOR_EACH_HPP
#define SLUICE_FOR_EACH_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/throw_error.hpp>
#include <sluice/stream.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <exception>
#include <functional>
#include <optional>
#include <type_traits>
#include <utility>

namespace sluice {

namespace detail {

// What a for_each body may return: void, bool, awaitable<void> or
// awaitable<bool> on the stream's executor.
template <class R, class Executor>
concept for_each_result = std::is_void_v<R> || std::is_same_v<R, bool> ||
    std::is_same_v<R, asio::awaitable<void, Executor>> ||
    std::is_same_v<R, asio::awaitable<bool, Executor>>;

template <class>
inline constexpr bool for_each_misuse = false;

}  // namespace detail

/// A body `sluice::for_each` can run for each result of a `stream<T, Executor>`:
/// callable with a `T` (an rvalue) and returning `void`, `bool`,
/// `asio::awaitable<void, Executor>` or `asio::awaitable<bool, Executor>`
/// (`false` stops early).
template <class Body, class T, class Executor = asio::any_io_executor>
concept for_each_body =
    std::invocable<Body&, T> && detail::for_each_result<std::invoke_result_t<Body&, T>, Executor>;

namespace detail {

template <class S>
struct stream_traits {
  static constexpr bool value = false;
};
template <class T, class Executor>
struct stream_traits<stream<T, Executor>> {
  static constexpr bool value = true;
  using value_type = T;
  using executor_type = Executor;
};

// A well-formed for_each(s, body): a non-const stream rvalue and a body for it.
template <class S, class Body>
concept for_each_call =
    std::is_rvalue_reference_v<S&&> && !std::is_const_v<std::remove_reference_t<S>> &&
    stream_traits<std::remove_cvref_t<S>>::value &&
    for_each_body<Body, typename stream_traits<std::remove_cvref_t<S>>::value_type,
                  typename stream_traits<std::remove_cvref_t<S>>::executor_type>;

// A body that returns void or bool, run by the stream's workers on each
// result that finishes while for_each waits in next() (the stream's sink):
// the caller's cancellation is checked before each result, as in the loop.
template <class T, class Executor, class Body>
struct body_sink : stream_access::sink<T, Executor> {
  using base = stream_access::sink<T, Executor>;
  using verdict = typename base::verdict;
  explicit body_sink(Body& b) noexcept : base{&take}, body(&b) {}
  static verdict take(base& self, T& value) noexcept {
    auto& me = static_cast<body_sink&>(self);
    if (me.state.cancelled() != asio::cancellation_type::none) return verdict::refused;
    using result = std::invoke_result_t<Body&, T>;
    try {
      if constexpr (std::is_void_v<result>) {
        std::invoke(*me.body, std::move(value));
        return verdict::taken;
      } else if constexpr (std::is_same_v<result, bool>) {
        return std::invoke(*me.body, std::move(value)) ? verdict::taken : verdict::stop;
      } else {
        return verdict::refused;  // an awaitable body is never a sink
      }
    } catch (...) {
      me.error = std::current_exception();
      return verdict::stop;
    }
  }
  Body* body;
  asio::cancellation_state state;
  std::exception_ptr error;  // the body's, when it threw
};

// Installs a sink on a stream for the duration of one next() wait.
template <class T, class Executor>
class sink_scope {
 public:
  sink_scope(stream<T, Executor>& s, stream_access::sink<T, Executor>* k) noexcept : s_(&s) {
    stream_access::set_sink(s, k);
  }
  sink_scope(const sink_scope&) = delete;
  sink_scope& operator=(const sink_scope&) = delete;
  ~sink_scope() {
    stream_access::set_sink(*s_, static_cast<stream_access::sink<T, Executor>*>(nullptr));
  }

 private:
  stream<T, Executor>* s_;
};

template <class T, class Executor, class Body>
asio::awaitable<void, Executor> run_for_each(stream<T, Executor> s, Body body) {
  using result = std::invoke_result_t<Body&, T>;
  constexpr bool sync_body = std::is_void_v<result> || std::is_same_v<result, bool>;
  std::exception_ptr error;
  [[maybe_unused]] body_sink<T, Executor, Body> sink(body);
  try {
    for (;;) {
      // A caller cancelled before the call (with throw_if_cancelled off) or
      // while the body ran stops here; with it on, Asio throws at next().
      const auto state = co_await asio::this_coro::cancellation_state;
      if (state.cancelled() != asio::cancellation_type::none)
        throw_system_error(asio::error::operation_aborted, "sluice::for_each");
      // A result already waiting is taken without a next() frame; next()
      // only when none does (it waits, starts the stream, or ends it).
      std::optional<T> r;
      if (!stream_access::try_take(s, r)) {
        if constexpr (sync_body) {
          // While next() waits, the workers hand each result that finishes
          // to the body themselves (the stream's sink): no buffer, no resume
          // of this coroutine per result. next() returns at the end, on a
          // stop or a failure, or with a result the sink refused because
          // this caller's cancellation was requested (checked again below).
          sink.state = state;
          sink_scope<T, Executor> scope(s, &sink);
          r = co_await s.next();
          if (sink.error) std::rethrow_exception(sink.error);
        } else {
          r = co_await s.next();
        }
        if (!r) break;
        if constexpr (sync_body) {
          const auto now = co_await asio::this_coro::cancellation_state;
          if (now.cancelled() != asio::cancellation_type::none)
            throw_system_error(asio::error::operation_aborted, "sluice::for_each");
        }
      }
      bool go_on = true;
      if constexpr (std::is_void_v<result>) {
        std::invoke(body, std::move(*r));
      } else if constexpr (std::is_same_v<result, bool>) {
        go_on = std::invoke(body, std::move(*r));
      } else if constexpr (std::is_same_v<result, asio::awaitable<void, Executor>>) {
        auto step = std::invoke(body, std::move(*r));
        co_await std::move(step);
      } else {
        auto step = std::invoke(body, std::move(*r));
        go_on = co_await std::move(step);
      }
      if (!go_on) break;
    }
  } catch (...) {
    // The body's exception wins, also over a cancellation it caused.
    error = sink.error ? sink.error : std::current_exception();
  }
  // Every way out: stop the stream and wait for every task, even if this
  // coroutine's cancellation was requested (throw_if_cancelled off). The
  // body's (or the stream's) exception wins over the close's.
  const bool was = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  co_await stream_access::close_then_rethrow(s, std::move(error), was);
}

}  // namespace detail

/// Runs `body(value)` for every result of `s`, in completion order, and
/// returns once the stream is done *and every task it started has finished*:
/// the scoped way to consume a `sluice::stream`.
///
/// `body` returns `void`, `bool`, `asio::awaitable<void>` or
/// `asio::awaitable<bool>`; `false` stops early. It runs on the awaiting
/// coroutine's executor, one result at a time (an awaitable body is awaited
/// before the next result is read; the stream's tasks keep running meanwhile,
/// bounded by its limit). Results that already wait are taken straight from
/// the stream, without suspending and without a `next()` call each, in the
/// order `next()` would hand them out; each frees its slot when taken. While
/// `for_each` waits, a body that returns `void` or `bool` is called by the
/// stream's worker whose task has just finished, still on this executor, one
/// result at a time and in completion order, and without resuming this
/// coroutine per result; the slots of those results go back (and the workers
/// waiting for one resume) in one post per wave, so results that finish
/// together all reach the body before any of their slots pulls a new input.
///
/// On every way out — the end of the stream, `false`, an exception from the
/// body, a failure of the stream, cancellation of the caller — `for_each`
/// closes the stream (no more input, running tasks cancelled, unread results
/// dropped), waits until every task has finished, and only then returns or
/// rethrows. So tasks that use the consumer's locals (a `[&]` mapping
/// function, a local `sluice::semaphore`) never outlive them, which a
/// `while (co_await s.next())` loop left by `break` or an exception does not
/// guarantee (see `sluice::stream`).
///
/// Throws: the body's exception, else the stream's failure (see
/// `stream::next()`); either wins over what the cancelled tasks throw.
///
/// Per-Operation Cancellation: cancelling the caller (while a body or
/// `next()` waits, or before the call when `throw_if_cancelled` is off)
/// cancels every task, waits for them, then throws `system_error` with
/// `asio::error::operation_aborted`. It is checked before every result, also
/// one that already waits: a body that cancels its own caller is not called
/// again. The wait runs with `throw_if_cancelled`
/// off, so it happens even when the cancellation came first.
///
/// Lifetimes: the stream and `body` are moved into the call.
///
/// @code
/// sluice::semaphore backend{2};
/// co_await sluice::for_each(
///     sluice::map_unordered([&](int i) -> asio::awaitable<int> {
///       auto permit = co_await backend.scoped_acquire();
///       co_return co_await work(i);
///     }, inputs, 4),
///     [&](int r) { return !enough(r); });  // false: stop; nothing runs on after this line
/// @endcode
template <class T, class Executor, class Body>
requires for_each_body<Body, T, Executor>
[[nodiscard]] asio::awaitable<void, Executor> for_each(stream<T, Executor>&& s, Body body) {
  return detail::run_for_each(std::move(s), std::move(body));
}

/// Misuse: reports a stream passed as an lvalue, something that is not a
/// stream, or a body of the wrong shape, in one line.
template <class S, class Body>
requires(!detail::for_each_call<S, Body>) void for_each(S&&, Body) {
  using traits = detail::stream_traits<std::remove_cvref_t<S>>;
  if constexpr (!traits::value) {
    static_assert(detail::for_each_misuse<S>,
                  "sluice::for_each(s, body): `s` must be a sluice::stream (from "
                  "sluice::map_unordered or sluice::as_completed).");
  } else if constexpr (!std::is_rvalue_reference_v<S&&> ||
                       std::is_const_v<std::remove_reference_t<S>>) {
    static_assert(detail::for_each_misuse<S>,
                  "sluice::for_each takes the stream by value, because it closes it: pass "
                  "std::move(s), or the sluice::map_unordered(...) call itself.");
  } else {
    static_assert(detail::for_each_misuse<S>,
                  "sluice::for_each(s, body): `body(value)` must take the stream's value type "
                  "and return void, bool, asio::awaitable<void> or asio::awaitable<bool> "
                  "(false stops early).");
  }
}

}  // namespace sluice

#endif  // SLUICE_FOR_EACH_HPP
