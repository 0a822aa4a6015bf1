// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TO_THREAD_HPP
#define SLUICE_TO_THREAD_HPP

#include <sluice/config.hpp>
#include <sluice/detail/caller_return.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <system_error>
#include <type_traits>
#include <utility>

namespace sluice {

namespace detail {

// One call of `fn` on another executor. Shared by the awaiting coroutine and
// the function object posted to that executor, so neither outlives the state
// it touches (also when the caller's loop is destroyed while `fn` runs).
// Invariant: once run() returned, exactly one of `value` / `error` is set.
template <class F>
struct thread_call {
  using result_type = std::invoke_result_t<F&>;
  using stored_type = std::conditional_t<std::is_void_v<result_type>, char, result_type>;

  explicit thread_call(F f) : fn(std::move(f)) {}

  void run() noexcept {
    try {
      if constexpr (std::is_void_v<result_type>) {
        std::invoke(fn);
        value.emplace('\0');
      } else {
        value.emplace(std::invoke(fn));
      }
    } catch (...) {
      error = std::current_exception();
    }
  }

  result_type take() {
    if (error) std::rethrow_exception(error);
    if constexpr (!std::is_void_v<result_type>) return std::move(*value);
  }

  F fn;
  std::optional<stored_type> value;
  std::exception_ptr error;
};

// The caller's side of one call (see caller_return): resumed by a post from
// the pool thread once `fn` has run, unless the caller's loop died first.
template <class Handler>
struct thread_return final : caller_return<Handler, asio::associated_executor_t<Handler>> {
  explicit thread_return(Handler&& h)
      : caller_return<Handler, asio::associated_executor_t<Handler>>(
            std::move(h), asio::get_associated_executor(h)) {}

  // On the pool thread, after fn ran: resumes the caller unless its loop died.
  void resume() {
    this->post_back([this] {
      asio::post(this->work->get_executor(),
                 [h = std::move(*this->handler)]() mutable { std::move(h)(); });
      this->drop();
    });
  }
};

// Posts the call to `ex`; when it has run, posts the handler back to its own
// associated executor (see thread_return). No cancellation handler is
// installed: `fn` cannot be interrupted.
template <class Executor, class Call>
struct initiate_to_thread {
  Executor ex;
  std::shared_ptr<Call> call;

  template <class Handler>
  void operator()(Handler&& handler) const {
    auto back =
        std::make_shared<thread_return<std::decay_t<Handler>>>(std::forward<Handler>(handler));
    back->watch();
    asio::post(ex, [c = call, b = std::move(back)]() mutable {
      c->run();
      c.reset();  // the caller is the only owner from here on
      b->resume();
    });
  }
};

}  // namespace detail

/// Runs `fn()` on `ex` (an `asio::thread_pool`'s executor, typically) and
/// resumes the awaiting coroutine on its own executor with `fn`'s result or
/// exception: asyncio's `to_thread`, for blocking or CPU-bound calls that must
/// not stall the loop.
///
/// - What runs where: `fn` runs on `ex` (the only sluice call that leaves the
///   caller's thread); the continuation is posted back to the coroutine's own
///   executor, never run on the pool. While `fn` runs, the caller's execution
///   context counts it as outstanding work, so its `io_context::run()` does not
///   return early.
/// - Per-Operation Cancellation: `fn` cannot be interrupted. A caller cancelled
///   while `fn` runs still waits for it to finish (so nothing `fn` captured by
///   reference dangles), discards its result or exception, and throws
///   `system_error(operation_aborted)`. A caller whose cancellation was
///   requested before the call does not run `fn` and throws
///   `operation_aborted`.
/// - Throws whatever `fn` throws.
///
/// Lifetimes: `fn` is moved into shared state and destroyed after it ran; what
/// it references must outlive the awaited call, and does, since the call
/// always waits for `fn`. `ex` must run the work it is given (a stopped pool
/// never resumes the caller). The caller's `io_context` may be destroyed while
/// `fn` runs (a loop stopped with `run_for()`): the suspended caller is then
/// destroyed with it, without resuming, `fn` still finishes on `ex`, and its
/// result is discarded there; nothing is posted into the dead loop.
///
/// @code
/// asio::thread_pool pool{4};
/// std::string digest = co_await sluice::to_thread(pool.get_executor(),
///                                                 [&] { return sha256(file_bytes); });
/// @endcode
template <class Executor, class F>
requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value) &&
    std::invocable<F&> [[nodiscard]] asio::awaitable<std::invoke_result_t<F&>> to_thread(
        Executor ex, F fn) {
  static_assert(!std::is_reference_v<std::invoke_result_t<F&>>,
                "sluice::to_thread: fn must return by value (a reference would be read on "
                "another thread after fn returned)");
  using call_type = detail::thread_call<F>;
  auto caller = co_await asio::this_coro::cancellation_state;
  if (caller.cancelled() != asio::cancellation_type::none)
    throw system_error(asio::error::operation_aborted, "sluice::to_thread: cancelled before start");
  auto call = std::make_shared<call_type>(std::move(fn));
  // A named initiation: g++ 12 may destroy a co_await operand's temporaries twice.
  detail::initiate_to_thread<Executor, call_type> initiation{std::move(ex), call};
  co_await asio::async_initiate<const asio::use_awaitable_t<>&, void()>(std::move(initiation),
                                                                        asio::use_awaitable);
  if (caller.cancelled() != asio::cancellation_type::none)
    throw system_error(asio::error::operation_aborted, "sluice::to_thread");
  co_return call->take();
}

}  // namespace sluice

#endif  // SLUICE_TO_THREAD_HPP
