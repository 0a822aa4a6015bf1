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
#include <sluice/detail/completion.hpp>

#include <sluice/detail/asio.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

namespace sluice::detail {

// One thing sluice holds of a context. Invariant: `attached` is true exactly
// while the hook is linked into a loop_life (guarded by its mutex).
struct loop_hook {
  loop_hook* prev = nullptr;
  loop_hook* next = nullptr;
  bool attached = false;
  bool first = false;  // linked among the hooks that end first (attach_first)
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
    h.first = false;
    link(head_, h);
    return true;
  }

  // As attach(), among the hooks whose on_end runs before every other's: the
  // waiter lists' watches, which take the loop's waiters out of every
  // primitive before any frame is destroyed (a destroyed frame releases what
  // it held, and must find no dying waiter to hand it to).
  bool attach_first(loop_hook& h) {
    const std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (ended_.load(std::memory_order_relaxed)) return false;
    h.first = true;
    link(first_, h);
    return true;
  }

  // From an on_end of a first hook: links `h` again among the others, for
  // end() to run its (new) on_end in the second round.
  void relink(loop_hook& h) noexcept {
    h.first = false;
    link(head_, h);
  }

  // Unlinks `h` if it is linked (a no-op once the shutdown took it).
  void detach(loop_hook& h) noexcept {
    const std::lock_guard<std::recursive_mutex> lock(mutex_);
    unlink(h.first ? first_ : head_, h);
  }

  // True once the context's shutdown has begun.
  [[nodiscard]] bool ended() const noexcept { return ended_.load(std::memory_order_acquire); }

  // Held across a post from another thread (see the class comment).
  [[nodiscard]] std::unique_lock<std::recursive_mutex> lock() {
    return std::unique_lock<std::recursive_mutex>(mutex_);
  }

  // From an on_end: the hook's operation is in the hands of another thread
  // that cannot take the lock yet (a grant between two mutexes). end() then
  // waits until that thread hand_back()s it, and runs its on_end again.
  void expect_hand_back() noexcept { ++expected_; }

  // From the thread that held the operation, under lock(): relinks `h` for
  // end() to finish (see expect_hand_back).
  void hand_back(loop_hook& h) noexcept {
    link(head_, h);
    --expected_;
    hand_backs_.fetch_add(1, std::memory_order_release);
    hand_backs_.notify_all();
  }

  // The context is going away: detach every hook and run its on_end, until
  // none is left or expected back.
  SLUICE_DECL void end() noexcept;

 private:
  static void link(loop_hook*& head, loop_hook& h) noexcept {
    h.prev = nullptr;
    h.next = head;
    if (head != nullptr) head->prev = &h;
    head = &h;
    h.attached = true;
  }
  static void unlink(loop_hook*& head, loop_hook& h) noexcept {
    if (!h.attached) return;
    (h.prev != nullptr ? h.prev->next : head) = h.next;
    if (h.next != nullptr) h.next->prev = h.prev;
    h.prev = h.next = nullptr;
    h.attached = false;
  }

  std::recursive_mutex mutex_;
  std::atomic<std::uint32_t> hand_backs_{0};  // hand_back() calls, waited on by end()
  std::atomic<bool> ended_{false};
  loop_hook* first_ = nullptr;  // guarded by mutex_; ended before head_
  loop_hook* head_ = nullptr;   // guarded by mutex_
  std::size_t expected_ = 0;    // operations end() waits to be handed back
};

// sluice's service on an execution context: owns the context's loop_life and
// ends it at shutdown.
class loop_service final : public asio::execution_context::service {
 public:
  using key_type = loop_service;
  inline static asio::execution_context::id id;

  SLUICE_DECL explicit loop_service(asio::execution_context& ctx);

  // The life of `ctx` (the service is added on first use). Call it from code
  // that runs on the context, or while the context is known to be alive.
  static std::shared_ptr<loop_life> life_of(asio::execution_context& ctx) {
    return asio::use_service<loop_service>(ctx).life_;
  }
  // The same for an executor's context; null for an executor without one
  // (use_future's: it only fulfils a promise, there is no loop to outlive).
  template <class Executor>
  static std::shared_ptr<loop_life> life_of_executor(const Executor& ex) {
    if constexpr (has_context<Executor>) {
      return life_of(asio::query(ex, asio::execution::context_as<asio::execution_context&>));
    } else {
      return nullptr;
    }
  }

  template <class Executor>
  static constexpr bool has_context =
      asio::can_query<const Executor&,
                      asio::execution::context_as_t<asio::execution_context&>>::value;

 private:
  SLUICE_DECL void shutdown() override;

  std::shared_ptr<loop_life> life_;
};

// A handler that sluice state holds while a coroutine waits in it (a join's
// parent, a stream's consumer), let go at its loop's end. Such a handler owns
// the waiting frame, and the frame owns the state: a cycle that only the
// completion used to break, so a loop destroyed meanwhile leaked both. Here
// the loop's shutdown destroys the handler (its slot cleared first) while the
// context still lives; the frame then lets go of the state.
//
// Attached to its context's life from the first hold until it is destroyed
// (or holds a handler of another context, or the context ends), whether or
// not it holds a handler right now: a stream's consumer waits once per wave
// of results, and attaching takes the life's mutex (an io_context run by
// several threads runs handlers of different strands at once). At the end
// a held handler is dropped; an empty one is just detached. Not movable: the
// hook's address is linked.
template <class... Args>
class loop_held_handler : private loop_hook {
 public:
  loop_held_handler() noexcept { on_end = &drop; }
  loop_held_handler(const loop_held_handler&) = delete;
  loop_held_handler& operator=(const loop_held_handler&) = delete;
  ~loop_held_handler() { detach(); }

  // Holds `h` (which completes on its associated executor, else `fallback`).
  template <class Handler, class Executor>
  void hold(Handler&& h, const Executor& fallback);

  explicit operator bool() const noexcept { return static_cast<bool>(handler_); }

  // As erased_handler's.
  void complete(Args... args) { handler_.complete(std::move(args)...); }
  void clear_slot() { handler_.clear_slot(); }

  // Takes the handler out (it is no longer let go at the loop's end).
  erased_handler<Args...> release() noexcept { return std::move(handler_); }

  // Destroys a held handler unrun.
  void reset() noexcept { handler_ = erased_handler<Args...>(); }

 private:
  void detach() noexcept {
    if (attached) life_->detach(*this);
  }

  static void drop(loop_hook* hook) noexcept {
    auto* self = static_cast<loop_held_handler*>(hook);
    if (!self->handler_) return;
    self->handler_.clear_slot();
    // The frame may own the state that owns *self: touch nothing after this.
    erased_handler<Args...> dead = std::move(self->handler_);
  }

  erased_handler<Args...> handler_;
  std::shared_ptr<loop_life> life_;         // of ctx_ (kept between holds)
  asio::execution_context* ctx_ = nullptr;  // compared only, never dereferenced
};

// Out of the class (not inline): a coroutine's handler is held by code
// compiled once with SLUICE_SEPARATE_COMPILATION.
template <class... Args>
template <class Handler, class Executor>
void loop_held_handler<Args...>::hold(Handler&& h, const Executor& fallback) {
  const auto ex = asio::get_associated_executor(h, fallback);
  handler_ = erased_handler<Args...>(std::forward<Handler>(h), fallback);
  if constexpr (loop_service::has_context<decltype(ex)>) {
    auto& ctx = asio::query(ex, asio::execution::context_as<asio::execution_context&>);
    if (&ctx != ctx_ || !attached) {
      detach();
      life_ = loop_service::life_of(ctx);
      ctx_ = &ctx;
      life_->attach(*this);
    }
  } else {
    detach();  // nothing to outlive: no context
    ctx_ = nullptr;
  }
}

#if defined(SLUICE_SEPARATE_COMPILATION)
extern template void loop_held_handler<>::hold(awaitable_handler_t<void()>&&,
                                               const asio::any_io_executor&);
#endif

}  // namespace sluice::detail

#if SLUICE_HEADER_DEFS
#include <sluice/impl/loop_service.ipp>
#endif

#endif  // SLUICE_DETAIL_LOOP_SERVICE_HPP
