// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_CHILD_SET_HPP
#define SLUICE_DETAIL_CHILD_SET_HPP

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <system_error>
#include <utility>

namespace sluice::detail {

// The child coroutines of one call (the workers of a gather, of a stream),
// child i bound to its own cancellation signal. It grows as children are added
// (a deque: signals never move).
// Held by shared_ptr: by the call and by each running child, so a child that
// outlives its parent's frame (the loop is being destroyed) touches no freed
// state.
//
// Invariants: running_ counts children started and not yet completed;
// running_child_[i] is true while child i runs; joiner_ is set only while a
// join waits and running_ > 0; stopping_ is sticky.
class child_set : public std::enable_shared_from_this<child_set> {
 public:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);

  child_set() = default;

  child_set(const child_set&) = delete;
  child_set& operator=(const child_set&) = delete;

  // Children started so far (running or finished).
  [[nodiscard]] std::size_t size() const noexcept { return signals_.size(); }
  [[nodiscard]] std::size_t running() const noexcept { return running_; }
  [[nodiscard]] bool running(std::size_t i) const noexcept { return running_child_[i]; }
  // True once cancel_all() was called (a failure, a cancelled parent, a close).
  [[nodiscard]] bool stopping() const noexcept { return stopping_; }
  // True once the joining parent was cancelled.
  [[nodiscard]] bool parent_cancelled() const noexcept { return parent_cancelled_; }
  // An exception that escaped a child coroutine itself (children catch their
  // tasks' exceptions; this is only set for failures of the machinery).
  [[nodiscard]] std::exception_ptr escaped() const noexcept { return escaped_; }

  // Starts a child on `ex`; returns its index.
  template <class Executor, class T>
  std::size_t spawn(const Executor& ex, asio::awaitable<T, Executor> child) {
    const std::size_t i = signals_.size();
    signals_.emplace_back();
    running_child_.push_back(true);
    ++running_;
    asio::co_spawn(
        ex, std::move(child),
        asio::bind_cancellation_slot(signals_[i].slot(), done_handler{shared_from_this(), i}));
    return i;
  }

  // Requests cancellation of child i if it is running.
  void cancel(std::size_t i, asio::cancellation_type type = asio::cancellation_type::terminal) {
    if (running_child_[i]) signals_[i].emit(type);
  }

  // Stops the set: stopping() becomes true and every running child except
  // `except` gets `type` (none: stop without cancelling anyone).
  void cancel_all(std::size_t except = none,
                  asio::cancellation_type type = asio::cancellation_type::terminal) {
    stopping_ = true;
    if (type == asio::cancellation_type::none) return;
    for (std::size_t i = 0; i < signals_.size(); ++i)
      if (i != except) cancel(i, type);
  }

  // Waits until no child runs: void(error_code). If the waiting parent is
  // cancelled meanwhile, every child is cancelled, the join still waits for all
  // of them, then completes with operation_aborted. Never completes inline.
  template <class Executor, class Token>
  auto async_join(const Executor& ex, Token&& token) {
    return asio::async_initiate<Token, void(error_code)>(
        [self = shared_from_this(), ex](auto handler) {
          if (self->running_ == 0) {
            post_completion(std::move(handler), ex,
                            self->parent_cancelled_ ? error_code(asio::error::operation_aborted)
                                                    : error_code());
            return;
          }
          auto slot = asio::get_associated_cancellation_slot(handler);
          if (slot.is_connected()) {
            slot.assign([s = self.get()](asio::cancellation_type type) {
              if (type == asio::cancellation_type::none) return;
              s->parent_cancelled_ = true;
              s->cancel_all();
            });
          }
          self->joiner_ = erased_handler<error_code>(std::move(handler), ex);
        },
        token);
  }

 private:
  struct done_handler {
    std::shared_ptr<child_set> self;
    std::size_t i;
    void operator()(std::exception_ptr e) const { self->on_done(i, e); }
  };

  void on_done(std::size_t i, std::exception_ptr e) {
    running_child_[i] = false;
    signals_[i].slot().clear();
    if (e && !escaped_) escaped_ = e;
    if (--running_ == 0 && joiner_) {
      joiner_.complete(parent_cancelled_ ? error_code(asio::error::operation_aborted)
                                         : error_code());
    }
  }

  std::deque<asio::cancellation_signal> signals_;
  std::deque<bool> running_child_;
  std::size_t running_ = 0;
  bool stopping_ = false;
  bool parent_cancelled_ = false;
  std::exception_ptr escaped_;
  erased_handler<error_code> joiner_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_CHILD_SET_HPP
