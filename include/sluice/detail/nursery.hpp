// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_NURSERY_HPP
#define SLUICE_DETAIL_NURSERY_HPP

// The running half of sluice::task_group: the coroutines it started (the body
// and the children), each with its cancellation signal, and the join that
// waits for all of them. What to start when, and what a failure means, is the
// owner's (task_group.hpp).

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/lazy.hpp>
#include <sluice/detail/loop_service.hpp>

#include <sluice/detail/asio.hpp>

#include <exception>
#include <iterator>
#include <list>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>

namespace sluice::detail {

// Owner (CRTP) provides shared_from_this() (a shared_ptr<Owner>),
// on_finished(bool child, std::exception_ptr), called once per coroutine
// after its node is gone, and cancel_from_parent(), called when the join's
// waiter is cancelled (the owner stops, then calls parent_cancelled()).
// Invariants: nodes_ holds exactly the coroutines started and not finished;
// body_ points at the body's node while it runs; the join completes once,
// when nodes_ becomes empty.
template <class Owner>
class nursery {
 protected:
  explicit nursery(asio::any_io_executor ex) : ex_(std::move(ex)) {}

  // Called by the owner's template entry before the first launch(): co_spawn's
  // entry point is a coroutine, compiled only in the TUs that instantiate
  // this (detail/lazy.hpp); launch() reaches it through a pointer.
  template <class Lazy>
  void arm() noexcept {
    spawn_ = &spawn<Lazy>;
  }

  // Starts `a` (Asio's co_spawn dispatches: it runs inline up to its first
  // suspension, and may even finish inside this call). Precondition: armed.
  void launch(asio::awaitable<void> a, bool is_body) {
    nodes_.emplace_back();
    auto it = std::prev(nodes_.end());
    it->is_body = is_body;
    if (is_body) body_ = it;
    spawn_(*this, std::move(a), it);
  }

  // Terminal cancellation to every running coroutine (the body included).
  void cancel_running() {
    for (auto it = nodes_.begin(); it != nodes_.end();) {
      auto next = std::next(it);  // a handler may finish its own node
      it->signal.emit(asio::cancellation_type::terminal);
      it = next;
    }
  }
  // Terminal cancellation to the body only, if it still runs.
  void cancel_body() {
    if (body_) (*body_)->signal.emit(asio::cancellation_type::terminal);
  }

  // The join will complete with operation_aborted.
  void parent_cancelled() noexcept { parent_cancelled_ = true; }
  [[nodiscard]] bool was_parent_cancelled() const noexcept { return parent_cancelled_; }

  // Waits until the body and every child have finished: void(error_code),
  // operation_aborted once parent_cancelled(). A cancelled waiter makes the
  // owner stop (cancel_from_parent) and still waits for all of it.
  template <class Token>
  auto async_join(Token&& token) {
    return asio::async_initiate<Token, void(error_code)>(
        [this](auto handler) {
          if (nodes_.empty()) {
            post_completion(std::move(handler), ex_, join_result());
            return;
          }
          auto slot = asio::get_associated_cancellation_slot(handler);
          if (slot.is_connected()) {
            slot.assign([this](asio::cancellation_type type) {
              if (type != asio::cancellation_type::none) owner().cancel_from_parent();
            });
          }
          joiner_.hold(std::move(handler), ex_);
        },
        token);
  }

  asio::any_io_executor ex_;

 private:
  // One running coroutine (the body or a child) and its cancellation signal.
  // Nodes live in a std::list: signals never move, erasure is O(1).
  struct node {
    asio::cancellation_signal signal;
    bool is_body = false;
  };
  using node_iter = typename std::list<node>::iterator;

  // Keeps the owner alive until the coroutine's completion has run.
  struct done_handler {
    std::shared_ptr<void> keep_alive;
    nursery* self;
    node_iter it;
    void operator()(std::exception_ptr e) const { self->done(it, std::move(e)); }
  };

  template <class Lazy>
  static void spawn(nursery& n, asio::awaitable<void> a, node_iter it) {
    asio::co_spawn(
        n.ex_, std::move(a),
        asio::bind_cancellation_slot(
            it->signal.slot(), lazy<Lazy>(done_handler{n.owner().shared_from_this(), &n, it})));
  }

  Owner& owner() noexcept { return static_cast<Owner&>(*this); }

  error_code join_result() const noexcept {
    return parent_cancelled_ ? error_code(asio::error::operation_aborted) : error_code();
  }

  void done(node_iter it, std::exception_ptr e) {
    it->signal.slot().clear();
    const bool child = !it->is_body;
    if (!child) body_.reset();
    nodes_.erase(it);
    owner().on_finished(child, std::move(e));
    if (nodes_.empty() && joiner_) joiner_.complete(join_result());
  }

  void (*spawn_)(nursery&, asio::awaitable<void>, node_iter) = nullptr;  // set by arm()
  std::list<node> nodes_;          // the body and the running children
  std::optional<node_iter> body_;  // the body's node while it runs
  bool parent_cancelled_ = false;
  loop_held_handler<error_code> joiner_;  // let go if its loop dies first
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_NURSERY_HPP
