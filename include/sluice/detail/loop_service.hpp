// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_LOOP_SERVICE_HPP
#define SLUICE_DETAIL_LOOP_SERVICE_HPP

// How sluice learns that an execution context is going away: the Asio way, an
// execution_context::service whose shutdown() runs when the context is
// destroyed (or shut down), before any other service of it dies. Services are
// shut down in the reverse order of their creation, and the scheduler is made
// first, so while loop_service::shutdown() runs the context still accepts
// posts (they are destroyed, not run, by the scheduler's own shutdown after
// it) and its timers and strands may still be destroyed.
//
// Anything sluice holds of a context beyond one handler's run (an operation
// waiting on another thread, a join's handler, a debug check's copy of a
// strand) attaches a loop_hook to the context's loop_life. At shutdown every
// attached hook is detached and its on_end runs, on the thread that destroys
// the context: it orphans the operation (after it nothing may post into the
// context) and breaks any handler <-> state cycle, destroying what the dead
// loop would have leaked.

#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>

#include <atomic>
#include <memory>
#include <mutex>

namespace sluice::detail {

// One thing sluice holds of a context. Invariant: `attached` is true exactly
// while the hook is linked into a loop_life (guarded by its mutex).
struct loop_hook {
  loop_hook* prev = nullptr;
  loop_hook* next = nullptr;
  bool attached = false;
  // Runs at the context's shutdown, under the life's (recursive) mutex, with
  // the hook already detached. Must not throw.
  void (*on_end)(loop_hook*) noexcept = nullptr;
};

// The lifetime of one execution context, shared by its loop_service and by
// everything that may outlive the context. The mutex orders other threads
// against the shutdown: a thread that holds it and sees the hook attached
// (or !ended()) may post into the context until it lets go. It is recursive
// because an on_end that destroys a coroutine frame may destroy other hooks
// of the same context (detach() from inside end()).
class loop_life {
 public:
  loop_life() = default;
  loop_life(const loop_life&) = delete;
  loop_life& operator=(const loop_life&) = delete;

  // Links `h`; false (and nothing linked) if the context has ended.
  bool attach(loop_hook& h) {
    const std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (ended_.load(std::memory_order_relaxed)) return false;
    h.prev = nullptr;
    h.next = head_;
    if (head_ != nullptr) head_->prev = &h;
    head_ = &h;
    h.attached = true;
    return true;
  }

  // Unlinks `h` if it is linked (a no-op once the shutdown took it).
  void detach(loop_hook& h) noexcept {
    const std::lock_guard<std::recursive_mutex> lock(mutex_);
    unlink(h);
  }

  // True once the context's shutdown has begun.
  [[nodiscard]] bool ended() const noexcept { return ended_.load(std::memory_order_acquire); }

  // Held across a post from another thread (see the class comment).
  [[nodiscard]] std::unique_lock<std::recursive_mutex> lock() {
    return std::unique_lock<std::recursive_mutex>(mutex_);
  }

  // The context is going away: detach every hook and run its on_end.
  void end() noexcept {
    const std::lock_guard<std::recursive_mutex> lock(mutex_);
    ended_.store(true, std::memory_order_release);
    while (loop_hook* h = head_) {
      unlink(*h);
      h->on_end(h);
    }
  }

 private:
  void unlink(loop_hook& h) noexcept {
    if (!h.attached) return;
    (h.prev != nullptr ? h.prev->next : head_) = h.next;
    if (h.next != nullptr) h.next->prev = h.prev;
    h.prev = h.next = nullptr;
    h.attached = false;
  }

  std::recursive_mutex mutex_;
  std::atomic<bool> ended_{false};
  loop_hook* head_ = nullptr;
};

// sluice's service on an execution context: owns the context's loop_life and
// ends it at shutdown.
class loop_service final : public asio::execution_context::service {
 public:
  using key_type = loop_service;
  inline static asio::execution_context::id id;

  explicit loop_service(asio::execution_context& ctx)
      : asio::execution_context::service(ctx), life_(std::make_shared<loop_life>()) {}

  // The life of `ctx` (the service is added on first use). Call it from code
  // that runs on the context, or while the context is known to be alive.
  static std::shared_ptr<loop_life> life_of(asio::execution_context& ctx) {
    return asio::use_service<loop_service>(ctx).life_;
  }
  template <class Executor>
  static std::shared_ptr<loop_life> life_of_executor(const Executor& ex) {
    return life_of(asio::query(ex, asio::execution::context_as<asio::execution_context&>));
  }

 private:
  void shutdown() override { life_->end(); }

  std::shared_ptr<loop_life> life_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_LOOP_SERVICE_HPP
