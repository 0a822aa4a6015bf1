// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_EVENT_HPP
#define SLUICE_EVENT_HPP

#include <sluice/config.hpp>
#include <sluice/detail/affinity.hpp>
#include <sluice/detail/lazy.hpp>
#include <sluice/detail/waiter_list.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <system_error>
#include <utility>

namespace sluice {

/// A loop-affine, sticky broadcast flag (Python's `asyncio.Event`): `set()`
/// wakes every current waiter, and later waits return at once until `clear()`.
/// One event, one edge: a pulse that fires repeatedly belongs in a `queue`.
///
/// `set()` completes every waiter that is waiting at that moment, even if
/// `clear()` follows at once; each waiter wakes exactly once.
///
/// What resumes where: `wait()` on a set event does not suspend. Woken waiters
/// are never resumed inside `set()`: each completion is posted to the handler's
/// associated executor (a coroutine's own), or to the event's executor for a
/// handler without one; such a handler given to an event constructed without
/// an executor makes `async_wait` throw `std::invalid_argument`.
///
/// Per-Operation Cancellation: `async_wait` supports terminal, partial and
/// total cancellation; a cancelled waiter is removed and completes with
/// `asio::error::operation_aborted`. A coroutine cancelled before it called
/// `wait` is refused at once, set or not (as `semaphore`). Destroying an event with waiters
/// completes them with `operation_aborted`.
///
/// Loop-affine and not thread-safe; debug builds abort on use from a thread
/// that is not running its loop (see `semaphore` for exactly what is checked).
///
/// @code
/// sluice::event stop;
/// auto worker = [&]() -> asio::awaitable<void> {
///   while (!stop.is_set()) co_await do_some_work();
/// };
/// co_await stop.wait();   // elsewhere: stop.set() wakes everyone
/// @endcode
class event {
 public:
  /// A clear event without an executor.
  event() : event(asio::any_io_executor{}) {}

  /// A clear event whose executor runs handlers that have none.
  template <class Executor>
  requires(asio::execution::is_executor<Executor>::value ||
           asio::is_executor<Executor>::value) explicit event(const Executor& ex)
      : ex_(ex) {
    affinity_.bind(ex_);
  }

  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() { detail::abort_all(waiters_); }

  /// Sets the flag and wakes every waiter (each through a post).
  void set() {
    const auto in = affinity_.enter("sluice::event");
    if (set_) return;
    set_ = true;
    while (detail::waiter_node* n = waiters_.pop_front()) {
      static_cast<detail::wait_op*>(n)->complete(error_code{});
    }
  }

  /// Clears the flag; later waits suspend until the next `set()`.
  void clear() {
    const auto in = affinity_.enter("sluice::event");
    set_ = false;
  }

  /// True while the flag is set.
  [[nodiscard]] bool is_set() const noexcept { return set_; }

  /// Waits until the flag is set. Completion signature
  /// `void(error_code)`; `operation_aborted` if cancelled or if the event
  /// is destroyed first. Completes through a post even when already set.
  template <asio::completion_token_for<void(error_code)> CompletionToken>
  auto async_wait(CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(error_code)>(
        [this](auto&& handler) {
          affinity_.bind(asio::get_associated_executor(handler, ex_));
          const auto in = affinity_.enter("sluice::event");
          detail::start_wait<detail::wait_op, detail::deliver_nothing>(
              std::forward<decltype(handler)>(handler), ex_, "sluice::event::async_wait", waiters_,
              set_, true);
        },
        token);
  }

  /// Waits until the flag is set; does not suspend if it already is.
  template <class Lazy = void>  // compiled only in the TUs that call it (detail/lazy.hpp)
  [[nodiscard]] asio::awaitable<void> wait() {
    detail::refuse_if_cancelled(co_await asio::this_coro::cancellation_state,
                                "sluice::event::wait");
    if constexpr (detail::affinity::enabled) affinity_.bind(co_await asio::this_coro::executor);
    {
      const auto in = affinity_.enter("sluice::event");
      if (set_) co_return;
    }
    co_await async_wait(detail::lazy<Lazy>(asio::use_awaitable));
  }

  /// Operations waiting now.
  [[nodiscard]] std::size_t waiters() const noexcept { return waiters_.size(); }
  /// The most operations that ever waited at once (high-water mark).
  [[nodiscard]] std::size_t max_waiters() const noexcept { return waiters_.max_size(); }

 private:
  explicit event(asio::any_io_executor&& ex) : ex_(std::move(ex)) {}

  asio::any_io_executor ex_;
  detail::waiter_list waiters_;
  bool set_ = false;
  [[no_unique_address]] detail::affinity affinity_;
};

}  // namespace sluice

#endif  // SLUICE_EVENT_HPP
