// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_WAITER_LIST_HPP
#define SLUICE_DETAIL_WAITER_LIST_HPP

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/waiter_queue.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>

namespace sluice::detail {

// A waiting operation whose completion starts with an error code; payloads
// (a queue item) live in derived node types. complete() unlinks nothing: the
// caller has already removed the node from its list. It posts the handler and
// destroys the operation.
//
// complete_deferred() posts the operation itself instead: it stays alive until
// its handler is about to run, and only then is its payload delivered. Until
// then the caller may link the node into a list of its own (a queue's items
// handed to getters that have not resumed) and change the payload; the node
// is unlinked before delivery, and when the loop drops the post. Handlers that
// do not complete on the loop (use_future) are completed at once instead
// (unlinked first): check `owner` after the call to know which happened.
struct wait_op : waiter_node {
  void (*complete_fn)(wait_op*, error_code, bool deferred) = nullptr;
  void complete(error_code ec) { complete_fn(this, ec, false); }
  void complete_deferred(error_code ec) { complete_fn(this, ec, true); }
};

// Delivery policy: what follows the error code in the completion. It may
// change the error code (a queue item dropped after its hand-off).
struct deliver_nothing {
  template <class Node>
  std::tuple<> operator()(Node&, error_code&) const noexcept {
    return {};
  }
};

struct no_executor {};

// True if the handler carries an executor of its own (a coroutine handler, a
// handler bound with asio::bind_executor, use_future's handler).
template <class Handler>
inline constexpr bool has_own_executor =
    !std::is_same_v<typename asio::associated_executor<Handler, no_executor>::type, no_executor>;

// True if the handler completes on an io_context's loop, where the primitive
// lives: its associated executor (or the primitive's, when it has none) is an
// any_io_executor (what coroutines carry), an io_context executor, or a strand
// of either. False for use_future's executor (Asio's system pool) and other
// foreign executors: a deferred completion must not touch the primitive from
// there, so such a handler is completed at once instead.
template <class Handler>
inline constexpr bool completes_on_loop = [] {
  using ex = typename asio::associated_executor<Handler, asio::any_io_executor>::type;
  using io = asio::io_context::executor_type;
  return std::is_same_v<ex, asio::any_io_executor> || std::is_same_v<ex, io> ||
         std::is_same_v<ex, asio::strand<io>> ||
         std::is_same_v<ex, asio::strand<asio::any_io_executor>>;
}();

// Throws if a handler has nowhere to run. `what` names the operation.
template <class Handler>
void require_executor(const asio::any_io_executor& fallback, const char* what) {
  if constexpr (!has_own_executor<Handler>) {
    if (!fallback) {
      throw std::invalid_argument(
          std::string(what) +
          ": the completion handler has no associated executor and the primitive was "
          "constructed without one; construct the primitive with an executor or bind "
          "one to the handler with asio::bind_executor");
    }
  }
}

// The operation object of one wait: the node, the handler, and (only when the
// handler has no executor of its own) the primitive's executor to run it on.
// Allocated with Asio's recycling allocator.
template <class Handler, class Node, class Deliver>
class handler_op final : public Node {
  struct empty_executor {};
  using fallback_type =
      std::conditional_t<has_own_executor<Handler>, empty_executor, asio::any_io_executor>;

 public:
  template <class H, class... NodeArgs>
  static handler_op* create(H&& h, const asio::any_io_executor& fallback, NodeArgs&&... args) {
    asio::recycling_allocator<handler_op> alloc;
    handler_op* p = alloc.allocate(1);
    try {
      return ::new (static_cast<void*>(p))
          handler_op(std::forward<H>(h), fallback, std::forward<NodeArgs>(args)...);
    } catch (...) {
      alloc.deallocate(p, 1);
      throw;
    }
  }

  // Installs the cancellation handler if the handler has a connected slot.
  void arm_cancellation() {
    auto slot = asio::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) slot.template emplace<cancel_handler>(this);
  }

  // Destroys a pending operation without running its handler, unlinking it
  // first if it is linked (a deferred completion the loop dropped).
  static void discard(handler_op* op) noexcept {
    if (op->owner != nullptr) op->owner->erase(op);
    auto slot = asio::get_associated_cancellation_slot(op->handler_);
    if (slot.is_connected()) slot.clear();
    destroy(op);
  }

 private:
  template <class H, class... NodeArgs>
  handler_op(H&& h, const asio::any_io_executor& fallback, NodeArgs&&... args)
      : Node(std::forward<NodeArgs>(args)...), handler_(std::forward<H>(h)) {
    if constexpr (!has_own_executor<Handler>) fallback_ = fallback;
    this->complete_fn = &do_complete;
    this->discard_fn = &discard_node;
  }

  static void discard_node(waiter_node* n) noexcept { discard(static_cast<handler_op*>(n)); }

  asio::any_io_executor fallback() const {
    if constexpr (has_own_executor<Handler>) {
      return {};
    } else {
      return fallback_;
    }
  }

  static void destroy(handler_op* op) noexcept {
    op->~handler_op();
    asio::recycling_allocator<handler_op>().deallocate(op, 1);
  }

  static void do_complete(wait_op* base, error_code ec, bool deferred) {
    auto* op = static_cast<handler_op*>(base);
    // Clear the slot first: the cancellation handler points at this op.
    auto slot = asio::get_associated_cancellation_slot(op->handler_);
    if (slot.is_connected()) slot.clear();
    // Not deferred (or a deferral refused: a handler that does not complete
    // on the loop): unlinked now, delivered when it runs (the node is nobody
    // else's any more). The op itself is posted, as a deferred one: every
    // handler_op posts the one op_post type (issue 32).
    if (!(deferred && completes_on_loop<Handler>)&&op->owner != nullptr) op->owner->erase(op);
    op->result_ = ec;
    auto ex = asio::get_associated_executor(op->handler_, op->fallback());
    post_to(ex, owning_post<handler_op, run_deferred, discard_op>(op));
  }

  // Owns an aborted operation until its completion runs (or the loop drops it).
  struct complete_aborted {
    void operator()(handler_op* op) const { op->complete(asio::error::operation_aborted); }
  };
  struct discard_op {
    void operator()(handler_op* op) const noexcept { discard(op); }
  };

  // Runs a completion: on the handler's executor already, so the handler is
  // invoked here, after the payload is delivered.
  struct run_deferred {
    void operator()(handler_op* op) const {
      if (op->owner != nullptr) op->owner->erase(op);
      error_code ec = op->result_;
      auto args = Deliver{}(static_cast<Node&>(*op), ec);
      Handler h(std::move(op->handler_));
      destroy(op);
      std::apply([&](auto&&... a) { std::move(h)(ec, std::forward<decltype(a)>(a)...); },
                 std::move(args));
    }
  };

  // Runs from the handler's cancellation slot. It may neither clear that slot
  // nor destroy the op inline, so it unlinks the waiter (after which nothing
  // can grant it) and completes it from a post.
  struct cancel_handler {
    explicit cancel_handler(handler_op* o) noexcept : op(o) {}
    handler_op* op;
    void operator()(asio::cancellation_type_t type) const {
      if ((type & (asio::cancellation_type::terminal | asio::cancellation_type::partial |
                   asio::cancellation_type::total)) == asio::cancellation_type::none)
        return;
      if (op->owner == nullptr) return;  // already granted or already cancelled
      waiter_list* list = op->owner;
      list->erase(op);
      auto ex = asio::get_associated_executor(op->handler_, op->fallback());
      asio::post(ex, owning_post<handler_op, complete_aborted, discard_op>(op));
      list->notify_cancelled();
    }
  };

  Handler handler_;
  [[no_unique_address]] fallback_type fallback_{};
  error_code result_{};  // a deferred completion's error code
};

// Completes every waiter in `list` with operation_aborted (a primitive is
// being destroyed).
inline void abort_all(waiter_list& list) {
  while (waiter_node* n = list.pop_front()) {
    static_cast<wait_op*>(n)->complete(asio::error::operation_aborted);
  }
}

// How start_wait started a wait.
enum class wait_start {
  waiting,    // linked into the list
  completed,  // `ready`: completed at once (through a post) without error
  refused,    // the caller's cancellation was already requested: completed at
              // once with operation_aborted; it must take nothing
};

// Starts one wait on `list`, or completes it at once (through a post) if
// `ready` is true. A `cancellable` wait whose coroutine's cancellation was
// requested before it called is refused instead, ready or not: every wait
// refuses such a caller in the same way. `what` names the operation for the
// executor error.
template <class Node, class Deliver, class Handler, class... NodeArgs>
wait_start start_wait(Handler&& handler, const asio::any_io_executor& fallback, const char* what,
                      waiter_list& list, bool ready, bool cancellable, NodeArgs&&... args) {
  using handler_type = std::decay_t<Handler>;
  using op_type = handler_op<handler_type, Node, Deliver>;
  require_executor<handler_type>(fallback, what);
  const bool refused = cancellable && cancel_requested(handler);
  asio::execution_context* loop = nullptr;
  if constexpr (completes_on_loop<handler_type>) {
    if (!ready && !refused) {
      const auto ex = asio::get_associated_executor(handler, fallback);
      loop = list.watch(&asio::query(ex, asio::execution::context_as<asio::execution_context&>));
    }
  }
  op_type* op =
      op_type::create(std::forward<Handler>(handler), fallback, std::forward<NodeArgs>(args)...);
  if (refused) {
    op->complete(asio::error::operation_aborted);
    return wait_start::refused;
  }
  if (ready) {
    op->complete(error_code{});
    return wait_start::completed;
  }
  op->loop = loop;
  list.push_back(op);
  if (cancellable) op->arm_cancellation();
  return wait_start::waiting;
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_WAITER_LIST_HPP
