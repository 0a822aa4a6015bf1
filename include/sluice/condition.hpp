// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_CONDITION_HPP
#define SLUICE_CONDITION_HPP

#include <sluice/config.hpp>
#include <sluice/detail/affinity.hpp>
#include <sluice/detail/lazy.hpp>
#include <sluice/detail/waiter_list.hpp>
#include <sluice/lock.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <cstddef>
#include <exception>
#include <limits>
#include <memory>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace sluice {

/// A loop-affine condition variable for coroutines (Python's
/// `asyncio.Condition`): a `lock` plus a FIFO of coroutines waiting to be
/// notified. It owns its lock, or shares one (`sluice::condition c{l};`).
///
/// `wait()` requires the lock held: it releases it, waits for a `notify()`,
/// then re-acquires it before returning. A notified waiter therefore runs only
/// after the notifier releases the lock. Re-check your predicate in a loop, or
/// use `wait(pred)`. Prefer a `queue` when the state is "is there an item".
///
/// What resumes where: notified waiters are never resumed inside `notify()`;
/// they are posted to their coroutine's executor and then queue for the lock.
///
/// Per-Operation Cancellation: `wait()` reacts to the coroutine's cancellation
/// (terminal, partial, total). Whatever happens, it re-acquires the lock before
/// it returns or throws, even when cancelled, and then throws
/// `system_error(operation_aborted)`. A waiter that was notified but
/// cancelled before `wait()` returned (still queued for the coroutine's turn,
/// or re-acquiring the lock) passes its notification on to the next waiter,
/// so a `notify()` racing with a cancellation is never lost. A coroutine
/// cancelled before it called `wait()` is refused: it gives the lock up, gets
/// it back, and throws `operation_aborted` without waiting for a notification.
/// `wait()` is an awaitable only (no `async_wait(token)`): its uncancellable
/// re-acquire needs the coroutine's `throw_if_cancelled` control.
///
/// Throws: `wait()` / `notify()` / `notify_all()` without the lock held throw
/// `std::logic_error`. Destroying a condition with waiters completes them with
/// `operation_aborted` (a shared lock must outlive the condition). When the
/// condition owns its lock, that lock is destroyed with it: such a waiter
/// throws without re-acquiring it and must not touch it again (a `lock::guard`
/// from the destroyed condition must not outlive it either).
///
/// Loop-affine and not thread-safe; debug builds abort on use from a thread
/// that is not running its loop (see `semaphore` for exactly what is checked).
///
/// @code
/// sluice::condition cv;
/// std::size_t items = 0;
/// // consumer                                    // producer
/// auto g = co_await cv.scoped_acquire();         auto g = co_await cv.scoped_acquire();
/// co_await cv.wait([&] { return items > 0; });   ++items;
/// --items;                                       cv.notify();
/// @endcode
class condition {
 public:
  /// A condition with its own lock and no executor.
  condition() : owned_(std::make_unique<sluice::lock>()), lock_(owned_.get()) {}

  /// A condition with its own lock, both using `ex` for handlers without one.
  template <class Executor>
  requires(asio::execution::is_executor<Executor>::value ||
           asio::is_executor<Executor>::value) explicit condition(const Executor& ex)
      : owned_(std::make_unique<sluice::lock>(ex)), lock_(owned_.get()) {}

  /// A condition sharing `l`, which must outlive it.
  explicit condition(sluice::lock& l) : lock_(&l) {}

  condition(const condition&) = delete;
  condition& operator=(const condition&) = delete;
  ~condition() { detail::abort_all(waiters_); }

  /// The lock this condition waits with.
  [[nodiscard]] sluice::lock& get_lock() noexcept { return *lock_; }

  /// Acquires the lock (see `lock::acquire`).
  template <class = void>  // a template: compiled only in the TUs that call it (issue 32)
  [[nodiscard]] asio::awaitable<void> acquire() {
    return lock_->acquire();
  }
  /// Acquires the lock, returning a guard that releases it.
  template <class = void>  // a template: compiled only in the TUs that call it (issue 32)
  [[nodiscard]] asio::awaitable<lock::guard> scoped_acquire() {
    return lock_->scoped_acquire();
  }
  /// Releases the lock (throws `std::logic_error` when it is not locked).
  void release() { lock_->release(); }
  /// True while the lock is held.
  [[nodiscard]] bool locked() const noexcept { return lock_->locked(); }

  /// Releases the lock, waits for a notification, re-acquires the lock.
  /// Throws `std::logic_error` if the lock is not held, and
  /// `system_error(operation_aborted)` when cancelled, in both cases with
  /// the lock held again.
  template <class Lazy = void>  // compiled only in the TUs that call it (detail/lazy.hpp)
  [[nodiscard]] asio::awaitable<void> wait() {
    if constexpr (detail::affinity::enabled) checker().bind(co_await asio::this_coro::executor);
    {
      const auto in = checker().enter("sluice::condition");
      if (!lock_->locked()) {
        throw std::logic_error("sluice::condition::wait: the lock is not held");
      }
    }
    auto state = co_await asio::this_coro::cancellation_state;
    const bool cancelled_before = state.cancelled() != asio::cancellation_type::none;
    // The condition may be destroyed while this coroutine is suspended (with it
    // the lock, when it owns it): `alive` tells, and from then on neither
    // `this` nor an owned lock is touched; a shared `l` must outlive it.
    const std::weak_ptr<const bool> alive = alive_;
    const bool owns_lock = owned_ != nullptr;
    sluice::lock* const l = lock_;
    l->release();
    // Destroyed with the frame before the lock is back (the loop destroyed
    // while this waits): counts as back, so the caller's guard, unwinding,
    // releases it once more without effect (a caller without a guard never
    // releases: the lock then stays held by the dead frame, as any permit a
    // destroyed frame holds by hand).
    struct relock_owed {
      sluice::lock* l;
      bool armed = true;
      ~relock_owed() {
        if (armed) l->core_.owe_release();
      }
    } owed{l};
    bool notified = false;
    std::exception_ptr failure;
    try {
      co_await wait_notified<Lazy>();
      notified = true;
    } catch (...) {
      failure = std::current_exception();
    }
    if (owns_lock && alive.expired()) {
      owed.armed = false;
      if (!failure) failure = std::make_exception_ptr(system_error(asio::error::operation_aborted));
      std::rethrow_exception(failure);
    }
    // Re-acquire even when cancelled: disable throw_if_cancelled meanwhile,
    // and wait without a cancellation slot.
    const bool throw_if = co_await asio::this_coro::throw_if_cancelled();
    co_await asio::this_coro::throw_if_cancelled(false);
    std::exception_ptr relock_failure;
    try {
      co_await l->core_.acquire_uncancellable();
    } catch (...) {
      relock_failure = std::current_exception();
    }
    owed.armed = false;
    co_await asio::this_coro::throw_if_cancelled(throw_if);
    if (relock_failure) std::rethrow_exception(relock_failure);
    if (failure) std::rethrow_exception(failure);
    if (notified && !cancelled_before && state.cancelled() != asio::cancellation_type::none) {
      // Notified, then cancelled before it could return: cancellation wins
      // and the notification goes to the next waiter, if there still is a
      // condition to have one.
      if (!alive.expired()) {
        const auto in = checker().enter("sluice::condition");
        wake(1);
      }
      throw system_error(asio::error::operation_aborted);
    }
  }

  /// Waits until `pred()` is true: `while (!pred()) co_await wait();`.
  /// `pred` is evaluated with the lock held; it is copied into the coroutine.
  template <std::predicate Pred>
  [[nodiscard]] asio::awaitable<void> wait(Pred pred) {
    while (!pred()) co_await wait();
  }

  /// Wakes up to `n` waiters (fewer is fine), oldest first. Each resumes once
  /// the lock is released and it gets it. Throws `std::logic_error` if the
  /// lock is not held.
  void notify(std::size_t n = 1) {
    const auto in = checker().enter("sluice::condition");
    if (!lock_->locked()) {
      throw std::logic_error("sluice::condition::notify: the lock is not held");
    }
    wake(n);
  }

  /// Wakes every waiter. Throws `std::logic_error` if the lock is not held.
  void notify_all() { notify(std::numeric_limits<std::size_t>::max()); }

  /// Coroutines waiting for a notification now.
  [[nodiscard]] std::size_t waiters() const noexcept { return waiters_.size(); }
  /// The most coroutines that ever waited for a notification at once.
  [[nodiscard]] std::size_t max_waiters() const noexcept { return waiters_.max_size(); }

 private:
  // The debug loop-affinity check: the lock's (one loop, one check).
  detail::affinity& checker() noexcept { return lock_->core_.checker(); }

  void wake(std::size_t n) {
    for (; n > 0; --n) {
      detail::waiter_node* w = waiters_.pop_front();
      if (w == nullptr) return;
      static_cast<detail::wait_op*>(w)->complete(error_code{});
    }
  }

  template <class Lazy>
  asio::awaitable<void> wait_notified() {
    return asio::async_initiate<const asio::use_awaitable_t<>&, void(error_code)>(
        [this](auto&& handler) {
          const auto& ex = lock_->core_.executor();
          checker().bind(asio::get_associated_executor(handler, ex));
          const auto in = checker().enter("sluice::condition");
          detail::start_wait<detail::wait_op, detail::deliver_nothing>(
              std::forward<decltype(handler)>(handler), ex, "sluice::condition::wait", waiters_,
              false, true);
        },
        detail::lazy<Lazy>(asio::use_awaitable));
  }

  std::unique_ptr<sluice::lock> owned_;
  sluice::lock* lock_;
  // Expires with the condition; suspended wait()s hold a weak_ptr to it.
  std::shared_ptr<const bool> alive_ = std::make_shared<const bool>(true);
  detail::waiter_list waiters_;
};

}  // namespace sluice

#endif  // SLUICE_CONDITION_HPP
