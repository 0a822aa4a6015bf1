// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_QUEUE_HPP
#define SLUICE_QUEUE_HPP

#include <sluice/config.hpp>
#include <sluice/detail/affinity.hpp>
#include <sluice/detail/queue_core.hpp>
#include <sluice/detail/queue_nodes.hpp>
#include <sluice/detail/waiter_list.hpp>
#include <sluice/queue_error.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <type_traits>
#include <utility>

namespace sluice {

/// A loop-affine FIFO queue for coroutines (Python's `asyncio.Queue`, with
/// Python 3.13's `shutdown()`): producers `put`, consumers `get`, and a
/// `maxsize` (0 = unbounded) makes `put` wait for room (backpressure).
///
/// Items are handed over directly: a `put` with a getter waiting gives the
/// item to the oldest getter; a `get` that frees room moves the oldest waiting
/// putter's item in. Getters and putters are served FIFO. `task_done()` /
/// `join()` count unfinished items as Python does.
///
/// Shutdown (`shutdown(immediate = false)`): every later put, and every waiting
/// putter, fails with `queue_shut_down` (error `queue_errc::shut_down` for the
/// `async_*` forms); gets drain the remaining items, then fail the same way.
/// `immediate = true` also drops the items (counting each as done for
/// `join()`), so waiting and later gets fail at once.
///
/// An item handed to a getter that has not resumed yet still belongs to the
/// queue, as in Python, where it would still be in the queue: a plain
/// shutdown lets the getter have it (it drains); an immediate shutdown drops
/// it, counts it as done at once (`unfinished_tasks()` falls, `join()` wakes),
/// and the getter fails with `queue_shut_down` (or `operation_aborted` if its
/// coroutine was also cancelled). Exception: a `use_future` getter (its
/// completion runs on Asio's system pool, off the loop) receives its item at
/// the hand-off, so no shutdown takes it back.
///
/// What resumes where: `get()` / `put()` that need not wait do not suspend.
/// Waiters are never resumed inside another call; each completion is posted to
/// the handler's associated executor (a coroutine's own), or to the queue's
/// executor for a handler without one (rejected with `std::invalid_argument`
/// if the queue has none).
///
/// Per-Operation Cancellation: `async_get`, `async_put`, `async_join` support
/// terminal, partial and total cancellation. A cancelled getter is removed and
/// never holds an item (an item handed to it first is not lost: `async_get`
/// then completes successfully with it, and `get()` whose coroutine was
/// cancelled before it resumed puts it back at the front or hands it to the
/// next getter, then throws `operation_aborted`; the queue may then briefly
/// hold one item more than `maxsize`). A `get()` cancelled before it resumed
/// throws `operation_aborted` whatever else happened meanwhile (a shutdown).
/// A cancelled putter is removed and its item is dropped; a putter whose item
/// already went in completes successfully. A coroutine cancelled before it
/// called `get`, `put` or `join` is refused at once with `operation_aborted`,
/// even when it need not wait: a get takes no item, a put's item does not go
/// in (it is dropped).
///
/// Throws: `task_done()` more often than items were put throws
/// `std::logic_error`. Destroying a queue with waiters completes them with
/// `operation_aborted`.
///
/// Loop-affine and not thread-safe; debug builds abort on use from a thread
/// that is not running its loop (see `semaphore` for exactly what is checked).
///
/// @code
/// sluice::queue<job> jobs{100};                     // put() waits when full
/// auto worker = [&]() -> asio::awaitable<void> {
///   for (;;) { job j = co_await jobs.get(); co_await run(j); jobs.task_done(); }
/// };
/// co_await jobs.put(job{42});
/// co_await jobs.join();                             // every job done
/// @endcode
template <std::movable T>
class queue : private detail::queue_core<T> {
 public:
  /// An unbounded (`maxsize == 0`) or bounded queue without an executor.
  explicit queue(std::size_t maxsize = 0) : detail::queue_core<T>(maxsize) {}

  /// A queue whose executor runs handlers that have none.
  template <class Executor>
  requires(asio::execution::is_executor<Executor>::value ||
           asio::is_executor<Executor>::value) explicit queue(const Executor& ex,
                                                              std::size_t maxsize = 0)
      : detail::queue_core<T>(ex, maxsize) {}

  queue(const queue&) = delete;
  queue& operator=(const queue&) = delete;
  ~queue() {
    // Getters handed an item keep it; their completions no longer refer to us.
    while (handed_.pop_front() != nullptr) {
    }
    detail::abort_all(getters_);
    detail::abort_all(putters_);
    detail::abort_all(joiners_);
  }

  /// Puts `value` if that needs no wait: returns false when full. Throws
  /// `queue_shut_down` after `shutdown()`.
  [[nodiscard]] bool try_put(T value) { return try_put_value(value, "sluice::queue::try_put"); }

  /// Takes the oldest item if there is one; empty when there is none. Throws
  /// `queue_shut_down` when the queue is shut down and empty.
  [[nodiscard]] std::optional<T> try_get() { return try_take("sluice::queue::try_get"); }

  /// Puts `value`, waiting for room. Completion signature
  /// `void(error_code)`: `queue_errc::shut_down` if the queue is (or gets)
  /// shut down, `operation_aborted` if cancelled or destroyed (the item is
  /// then dropped).
  template <asio::completion_token_for<void(error_code)> CompletionToken>
  auto async_put(T value, CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(error_code)>(
        [this](auto&& handler, T v) {
          affinity_.bind(asio::get_associated_executor(handler, ex_));
          const auto in = affinity_.enter("sluice::queue");
          using node = detail::put_node<T>;
          if (const error_code ec = refusal(handler)) {
            this->template start_failed<node, detail::deliver_nothing>(
                std::forward<decltype(handler)>(handler), "sluice::queue::async_put", ec,
                std::move(v));
            return;
          }
          const bool ready = can_put_now();
          if (ready) {
            detail::require_executor<std::decay_t<decltype(handler)>>(ex_,
                                                                      "sluice::queue::async_put");
            put_now(v);
          }
          detail::start_wait<node, detail::deliver_nothing>(
              std::forward<decltype(handler)>(handler), ex_, "sluice::queue::async_put", putters_,
              ready, true, std::move(v));
        },
        token, std::move(value));
  }

  /// Puts `value`, waiting for room; does not suspend when there is room.
  /// Throws `queue_shut_down` after `shutdown()`, and
  /// `system_error(operation_aborted)` if cancelled before the item went in.
  [[nodiscard]] asio::awaitable<void> put(T value) {
    detail::refuse_if_cancelled(co_await asio::this_coro::cancellation_state, "sluice::queue::put");
    if constexpr (detail::affinity::enabled) affinity_.bind(co_await asio::this_coro::executor);
    if (try_put_value(value, "sluice::queue::put")) co_return;
    error_code ec;
    co_await async_put(std::move(value), asio::redirect_error(asio::use_awaitable, ec));
    if (ec == queue_errc::shut_down) {
      throw queue_shut_down("sluice::queue::put: the queue was shut down");
    }
    if (ec) throw system_error(ec);
  }

  /// Takes the oldest item, waiting for one. Completion signature
  /// `void(error_code, T)` (needs a default-constructible `T` for the
  /// error case): `queue_errc::shut_down` when shut down and empty,
  /// `operation_aborted` if cancelled or destroyed.
  template <asio::completion_token_for<void(error_code, T)> CompletionToken>
  requires std::default_initializable<T>
  auto async_get(CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(error_code, T)>(
        [self = this](auto&& handler) {
          self->template initiate_get<detail::deliver_item<T>>(
              std::forward<decltype(handler)>(handler), "sluice::queue::async_get");
        },
        token);
  }

  /// Takes the oldest item, waiting for one; does not suspend when there is
  /// one. Throws `queue_shut_down` when shut down and empty, and
  /// `system_error(operation_aborted)` if cancelled (no item is lost).
  [[nodiscard]] asio::awaitable<T> get() {
    auto state = co_await asio::this_coro::cancellation_state;
    detail::refuse_if_cancelled(state, "sluice::queue::get");
    if constexpr (detail::affinity::enabled) affinity_.bind(co_await asio::this_coro::executor);
    if (std::optional<T> ready = try_take("sluice::queue::get")) co_return std::move(*ready);
    error_code ec;
    auto token = asio::redirect_error(asio::use_awaitable, ec);
    std::optional<T> item =
        co_await asio::async_initiate<decltype(token), void(error_code, std::optional<T>)>(
            [self = this](auto&& handler) {
              self->template initiate_get<detail::deliver_optional<T>>(
                  std::forward<decltype(handler)>(handler), "sluice::queue::get");
            },
            token);
    if (state.cancelled() != asio::cancellation_type::none) {
      // Cancelled before it resumed: cancellation wins (Python's CancelledError).
      // Only an item actually received is given back; after an error (a
      // shutdown, a destroyed queue) `this` is not touched.
      if (!ec) give_back(std::move(*item));
      throw system_error(asio::error::operation_aborted);
    }
    if (ec == queue_errc::shut_down) {
      throw queue_shut_down("sluice::queue::get: the queue was shut down");
    }
    if (ec) throw system_error(ec);
    co_return std::move(*item);
  }

  /// Marks one item taken earlier as processed. Throws `std::logic_error` if
  /// called more times than items were put.
  void task_done() {
    const auto in = affinity_.enter("sluice::queue");
    if (unfinished_ == 0) {
      throw std::logic_error(
          "sluice::queue::task_done: called more times than there were items put");
    }
    if (--unfinished_ == 0) wake_joiners();
  }

  /// Waits until every item put has been marked `task_done()`. Completion
  /// signature `void(error_code)`; `operation_aborted` if cancelled or
  /// destroyed.
  template <asio::completion_token_for<void(error_code)> CompletionToken>
  auto async_join(CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(error_code)>(
        [this](auto&& handler) {
          affinity_.bind(asio::get_associated_executor(handler, ex_));
          const auto in = affinity_.enter("sluice::queue");
          detail::start_wait<detail::wait_op, detail::deliver_nothing>(
              std::forward<decltype(handler)>(handler), ex_, "sluice::queue::async_join", joiners_,
              unfinished_ == 0, true);
        },
        token);
  }

  /// Waits until every item put has been marked done; does not suspend if
  /// none is unfinished.
  [[nodiscard]] asio::awaitable<void> join() {
    detail::refuse_if_cancelled(co_await asio::this_coro::cancellation_state,
                                "sluice::queue::join");
    if constexpr (detail::affinity::enabled) affinity_.bind(co_await asio::this_coro::executor);
    {
      const auto in = affinity_.enter("sluice::queue");
      if (unfinished_ == 0) co_return;
    }
    co_await async_join(asio::use_awaitable);
  }

  /// Shuts the queue down (Python 3.13): later puts fail, waiting putters fail,
  /// gets drain what is left and then fail with `queue_shut_down`.
  /// `immediate` drops the items now, counting each as done for `join()`,
  /// including items handed to getters that have not resumed yet (those
  /// getters fail with `queue_shut_down`).
  void shutdown(bool immediate = false) {
    const auto in = affinity_.enter("sluice::queue");
    shut_down_ = true;
    if (immediate) {
      while (!items_.empty()) {
        items_.pop_front();
        if (unfinished_ > 0) --unfinished_;
      }
      while (detail::waiter_node* n = handed_.pop_front()) {
        static_cast<detail::get_node<T>*>(n)->item.reset();
        if (unfinished_ > 0) --unfinished_;
      }
      if (unfinished_ == 0) wake_joiners();
    }
    const error_code ec = queue_errc::shut_down;
    // Getters wait only while the queue is empty.
    while (detail::waiter_node* n = getters_.pop_front())
      static_cast<detail::wait_op*>(n)->complete(ec);
    while (detail::waiter_node* n = putters_.pop_front())
      static_cast<detail::wait_op*>(n)->complete(ec);
  }

  /// Items in the queue now.
  [[nodiscard]] std::size_t size() const noexcept { return items_.size(); }
  /// True when there is no item.
  [[nodiscard]] bool empty() const noexcept { return items_.empty(); }
  /// True when bounded and `size() >= maxsize()`.
  [[nodiscard]] bool full() const noexcept { return core::full(); }
  /// The bound given at construction (0 = unbounded).
  [[nodiscard]] std::size_t maxsize() const noexcept { return maxsize_; }
  /// True after `shutdown()`.
  [[nodiscard]] bool is_shut_down() const noexcept { return shut_down_; }
  /// Items put and not yet marked `task_done()`.
  [[nodiscard]] std::size_t unfinished_tasks() const noexcept { return unfinished_; }
  /// Operations waiting in `get` now.
  [[nodiscard]] std::size_t getters() const noexcept { return getters_.size(); }
  /// Operations waiting in `put` now.
  [[nodiscard]] std::size_t putters() const noexcept { return putters_.size(); }
  /// Operations waiting in `get` or `put` now.
  [[nodiscard]] std::size_t waiters() const noexcept { return getters_.size() + putters_.size(); }
  /// The most operations that ever waited in `get` (or in `put`) at once.
  [[nodiscard]] std::size_t max_waiters() const noexcept {
    return getters_.max_size() > putters_.max_size() ? getters_.max_size() : putters_.max_size();
  }

 private:
  using core = detail::queue_core<T>;
  using core::affinity_, core::ex_, core::items_, core::getters_, core::putters_, core::joiners_,
      core::handed_, core::maxsize_, core::unfinished_, core::shut_down_;
  using core::can_put_now, core::put_now, core::try_put_value, core::try_take, core::give_back,
      core::refusal, core::wake_joiners;
};

}  // namespace sluice

#endif  // SLUICE_QUEUE_HPP
