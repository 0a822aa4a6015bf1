// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_QUEUE_CORE_HPP
#define SLUICE_DETAIL_QUEUE_CORE_HPP

// The state of a sluice::queue (queue.hpp) and how items move: into the
// store or straight to the oldest getter, out of it with the oldest putter's
// item moved in, back to the front for a getter cancelled before it resumed.
// queue.hpp is the public face: waiting, shutdown, task_done / join.

#include <sluice/config.hpp>
#include <sluice/detail/affinity.hpp>
#include <sluice/detail/queue_nodes.hpp>
#include <sluice/detail/waiter_list.hpp>
#include <sluice/queue_error.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

namespace sluice::detail {

// Invariants: getters_ waits only while items_ is empty, putters_ only while
// the store is full; an item handed to a getter sits in handed_ until the
// getter's completion runs; unfinished_ counts items put and not task_done().
template <std::movable T>
class queue_core {
 protected:
  explicit queue_core(std::size_t maxsize) : maxsize_(maxsize) {}
  queue_core(asio::any_io_executor ex, std::size_t maxsize)
      : ex_(std::move(ex)), maxsize_(maxsize) {
    affinity_.bind(ex_);
  }

  [[nodiscard]] bool full() const noexcept { return maxsize_ > 0 && items_.size() >= maxsize_; }

  bool can_put_now() const noexcept { return !getters_.empty() || !full(); }

  // Precondition: not shut down. Moves from `v` only when it returns true.
  bool put_now(T& v) {
    if (waiter_node* n = getters_.pop_front()) {
      // A getter waits only while the queue is empty: hand the item over.
      ++unfinished_;
      hand_over(n, std::move(v));
      return true;
    }
    if (full()) return false;
    items_.push_back(std::move(v));
    ++unfinished_;
    return true;
  }

  // try_put / put without waiting; `what` names the caller in the exception.
  bool try_put_value(T& v, const char* what) {
    const auto in = affinity_.enter("sluice::queue");
    if (shut_down_)
      throw queue_shut_down((std::string(what) + ": the queue was shut down").c_str());
    return put_now(v);
  }

  // try_get / get without waiting: the oldest item, none if empty; throws
  // when shut down and empty.
  std::optional<T> try_take(const char* what) {
    const auto in = affinity_.enter("sluice::queue");
    if (!items_.empty()) return take_front();
    if (shut_down_)
      throw queue_shut_down((std::string(what) + ": the queue was shut down").c_str());
    return std::nullopt;
  }

  // Precondition: !items_.empty().
  std::optional<T> take_front() {
    std::optional<T> v(std::move(items_.front()));
    items_.pop_front();
    if (!full()) {
      if (waiter_node* n = putters_.pop_front()) {
        auto* p = static_cast<put_node<T>*>(n);
        items_.push_back(std::move(*p->item));
        p->item.reset();
        ++unfinished_;
        p->complete(error_code{});
      }
    }
    return v;
  }

  // Gives `v` to the getter `n` (unlinked). Until the getter resumes, the
  // item stays in handed_, where an immediate shutdown can still drop it.
  void hand_over(waiter_node* n, T&& v) {
    auto* g = static_cast<get_node<T>*>(n);
    g->item.emplace(std::move(v));
    handed_.push_back(g);
    g->complete_deferred(error_code{});
  }

  // An item granted to a get() whose coroutine was cancelled before resuming.
  // (An immediate shutdown since the hand-off would have dropped it instead.)
  void give_back(T&& v) {
    const auto in = affinity_.enter("sluice::queue");
    if (waiter_node* n = getters_.pop_front()) {
      hand_over(n, std::move(v));
      return;
    }
    items_.push_front(std::move(v));
  }

  template <class Deliver, class Handler>
  void initiate_get(Handler&& handler, const char* what) {
    affinity_.bind(asio::get_associated_executor(handler, ex_));
    const auto in = affinity_.enter("sluice::queue");
    using node = get_node<T>;
    if (cancel_requested(handler)) {
      start_failed<node, Deliver>(std::forward<Handler>(handler), what,
                                  asio::error::operation_aborted);
      return;
    }
    if (!items_.empty()) {
      require_executor<std::decay_t<Handler>>(ex_, what);
      // Handed over at once, through the same path as a waiting getter.
      start_wait<node, Deliver>(std::forward<Handler>(handler), ex_, what, handed_, false, false,
                                *take_front());
      static_cast<wait_op*>(handed_.back())->complete_deferred(error_code{});
      return;
    }
    if (shut_down_) {
      start_failed<node, Deliver>(std::forward<Handler>(handler), what, queue_errc::shut_down);
      return;
    }
    start_wait<node, Deliver>(std::forward<Handler>(handler), ex_, what, getters_, false, true);
  }

  // Why a put must fail at once: its caller was cancelled before it called
  // (operation_aborted, as every wait), or the queue is shut down; none if not.
  template <class Handler>
  error_code refusal(const Handler& handler) const {
    if (cancel_requested(handler)) return asio::error::operation_aborted;
    if (shut_down_) return queue_errc::shut_down;
    return {};
  }

  // Completes a new operation at once (through a post) with `ec`, taking
  // nothing (a put's item is dropped).
  template <class Node, class Deliver, class Handler, class... NodeArgs>
  void start_failed(Handler&& handler, const char* what, error_code ec, NodeArgs&&... args) {
    waiter_list scratch{false};
    start_wait<Node, Deliver>(std::forward<Handler>(handler), ex_, what, scratch, false, false,
                              std::forward<NodeArgs>(args)...);
    static_cast<wait_op*>(scratch.pop_front())->complete(ec);
  }

  void wake_joiners() {
    while (waiter_node* n = joiners_.pop_front()) {
      static_cast<wait_op*>(n)->complete(error_code{});
    }
  }

  asio::any_io_executor ex_;
  std::deque<T> items_;
  waiter_list getters_;
  waiter_list putters_;
  waiter_list joiners_;
  // Getters handed an item whose handler has not run yet (deferred completions).
  waiter_list handed_{false};
  std::size_t maxsize_;
  std::size_t unfinished_ = 0;
  bool shut_down_ = false;
  [[no_unique_address]] affinity affinity_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_QUEUE_CORE_HPP
