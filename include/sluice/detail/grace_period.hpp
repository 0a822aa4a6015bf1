// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_GRACE_PERIOD_HPP
#define SLUICE_DETAIL_GRACE_PERIOD_HPP

// The grace a stop request gives a sluice::task_group's running children:
// the earliest deadline asked for, and the one timer coroutine that waits for
// it (the owner writes the timer: waiting on time is above detail/).

#include <sluice/config.hpp>
#include <sluice/detail/child_set.hpp>
#include <sluice/detail/lazy.hpp>
#include <sluice/detail/virtual_clock.hpp>

#include <sluice/detail/asio.hpp>

#include <memory>
#include <optional>
#include <system_error>
#include <utility>

namespace sluice::detail {

// Invariant: timers_ runs at most one timer, the one for deadline_.
class grace_period {
 public:
  // True if `deadline` is earlier than any grace asked for so far: the
  // running timer (if any) is cancelled and the caller starts the new one
  // with start().
  bool shorten(clock::time_point deadline) {
    if (deadline_ && *deadline_ <= deadline) return false;
    deadline_ = deadline;
    if (timers_) timers_->cancel_all();  // a shorter grace replaces the running timer
    return true;
  }

  // A template, as finish(): compiled only where the owner's template entry
  // calls it (detail/lazy.hpp).
  template <class Executor>
  void start(const Executor& ex, asio::awaitable<void, Executor> timer) {
    if (!timers_) timers_ = child_set::make();
    timers_->spawn(ex, std::move(timer));
  }

  // Ends a timer that still waits, and waits for it (errors ignored).
  template <class Lazy = void>  // compiled only in the TUs that call it (detail/lazy.hpp)
  asio::awaitable<void> finish(asio::any_io_executor ex) {
    if (!timers_) co_return;
    error_code ec;
    timers_->cancel_all();
    co_await timers_->async_join(ex, asio::redirect_error(lazy<Lazy>(asio::use_awaitable), ec));
  }

 private:
  std::optional<clock::time_point> deadline_;
  std::shared_ptr<child_set> timers_;  // the grace timer, once a stop asked for one
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_GRACE_PERIOD_HPP
