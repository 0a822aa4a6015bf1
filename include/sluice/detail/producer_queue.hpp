// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_PRODUCER_QUEUE_HPP
#define SLUICE_DETAIL_PRODUCER_QUEUE_HPP

// The producers waiting in task_group::spawn_when_ready for a slot (and in
// keyed_task_group::spawn_when_ready for room in the key queues): FIFO, each
// with its item (a child not started, or a key and a child) and its handler,
// void(error_code, bool).

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/lazy.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <iterator>
#include <list>
#include <system_error>
#include <utility>

namespace sluice::detail {

// Invariant: every entry's handler is set once wait()'s initiation returns;
// an entry leaves the list exactly once: granted (grant_front), refused
// (refuse_all) or cancelled (its slot's handler), and its handler completes
// through a post each time. Nodes live in a std::list: erasure is O(1).
template <class Item = asio::awaitable<void>>
class producer_queue {
  struct waiter {
    Item child;
    erased_handler<error_code, bool> handler;
  };

 public:
  [[nodiscard]] bool empty() const noexcept { return list_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return list_.size(); }

  // Waits for grant_front() (true) or refuse_all() (false). Cancellation
  // (terminal, partial, total) removes the waiter and destroys its child
  // unstarted; the wait then completes with operation_aborted. Completions
  // are posted, never run inside the call that caused them; `ex` is where a
  // handler without an executor of its own runs.
  // A template: compiled only in the TUs that call it (detail/lazy.hpp).
  template <class Lazy = void>
  asio::awaitable<bool> wait(asio::any_io_executor ex, Item child) {
    return asio::async_initiate<const asio::use_awaitable_t<>&, void(error_code, bool)>(
        [this, ex](auto handler, Item c) {
          list_.push_back(waiter{std::move(c), {}});
          auto it = std::prev(list_.end());
          auto slot = asio::get_associated_cancellation_slot(handler);
          if (slot.is_connected()) {
            slot.assign([this, it, ex](asio::cancellation_type type) {
              if (type == asio::cancellation_type::none) return;
              // Not granted yet (a granted waiter's slot is cleared first):
              // remove it. The handler is completed from a post, never from
              // inside its own slot's handler.
              auto h = std::move(it->handler);
              list_.erase(it);  // the child is destroyed unstarted
              asio::post(ex, [h = std::move(h)]() mutable {
                h.complete(asio::error::operation_aborted, false);
              });
            });
          }
          it->handler = erased_handler<error_code, bool>(std::move(handler), ex);
        },
        lazy<Lazy>(asio::use_awaitable), std::move(child));
  }

  // The oldest producer gets its slot: its wait completes with true (posted)
  // and its child is returned, for the caller to start. Precondition: !empty().
  Item grant_front() {
    auto w = std::move(list_.front());
    list_.pop_front();
    w.handler.complete(error_code(), true);  // clears its slot, posts
    return std::move(w.child);
  }

  // Every waiting producer resumes with false; their children never start.
  void refuse_all() {
    auto refused = std::move(list_);
    list_.clear();
    for (auto& w : refused) w.handler.complete(error_code(), false);
  }

 private:
  std::list<waiter> list_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_PRODUCER_QUEUE_HPP
