// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_SHARED_PERMIT_CORE_HPP
#define SLUICE_DETAIL_SHARED_PERMIT_CORE_HPP

#include <sluice/config.hpp>
#include <sluice/detail/loop_service.hpp>
#include <sluice/detail/stats_recorder.hpp>
#include <sluice/detail/waiter_list.hpp>
#include <sluice/overloaded_error.hpp>
#include <sluice/stats.hpp>

#include <sluice/detail/asio.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <system_error>
#include <type_traits>
#include <utility>

namespace sluice::detail {

class shared_permit_core;

// A wait on a shared_permit_core. `linked` mirrors "is in the core's list"; it
// is written under the core's mutex and read without it only as a pre-check by
// the cancellation handler (a granted or removed op never touches the core).
// grant_fn posts the completion to the waiter's executor; callable from any
// thread, once, after the op has left the list.
struct shared_wait_node : waiter_node {
  std::atomic<bool> linked{false};
  clock::time_point since{};  // when it was queued (its wait time)
  // The waiting coroutine's, when it counts the grant itself (written by the
  // granting thread before the completion is posted).
  pending_grant* pending = nullptr;
  shared_permit_core* core = nullptr;
  void (*grant_fn)(shared_wait_node*, error_code) = nullptr;
};

// The thread-safe counting core of shared_semaphore.
//
// State: one 64-bit atomic word, free permits in the low 32 bits, waiters in
// the high 32 bits. Invariants: the waiter count changes only under mu_,
// together with the list, so under mu_ it equals waiters_.size(); free permits
// and waiters are never both non-zero (a release with waiters hands its permit
// to the oldest one; an acquire queues only when no permit is free). Hence the
// lock-free paths: try_acquire takes a permit with one CAS when the word says
// "free permits, no waiters", release adds one with one CAS when it says "no
// waiters"; everything else takes mu_.
class shared_permit_core {
 public:
  static constexpr std::uint64_t one_waiter = std::uint64_t{1} << 32;
  static constexpr std::uint64_t value_mask = one_waiter - 1;

  // `max_waiting`: a waiter behind that many others is shed (completed with
  // overloaded_code(), never queued).
  shared_permit_core(std::size_t initial, asio::any_io_executor ex,
                     std::size_t max_waiting = static_cast<std::size_t>(-1))
      : ex_(std::move(ex)), initial_(initial), max_waiting_(max_waiting) {
    if (initial > value_mask)
      throw std::invalid_argument("sluice::shared_semaphore: initial value above 2^32 - 1");
    word_.store(initial, std::memory_order_relaxed);
    stats_.bind(ex_);
  }
  shared_permit_core(const shared_permit_core&) = delete;
  shared_permit_core& operator=(const shared_permit_core&) = delete;

  // Completes every waiter with operation_aborted.
  ~shared_permit_core() {
    waiter_list aborted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (waiter_node* n = waiters_.pop_front()) {
        static_cast<shared_wait_node*>(n)->linked.store(false, std::memory_order_relaxed);
        aborted.push_back(n);
      }
    }
    while (waiter_node* n = aborted.pop_front()) {
      auto* w = static_cast<shared_wait_node*>(n);
      w->grant_fn(w, asio::error::operation_aborted);
    }
  }

  bool try_acquire() noexcept {
    std::uint64_t w = word_.load(std::memory_order_relaxed);
    while ((w & ~value_mask) == 0 && (w & value_mask) != 0) {
      if (word_.compare_exchange_weak(w, w - 1, std::memory_order_acquire,
                                      std::memory_order_relaxed)) {
        stats_.acquired.fetch_add(1, std::memory_order_relaxed);
        return true;
      }
    }
    return false;
  }

  void release() {
    std::uint64_t w = word_.load(std::memory_order_relaxed);
    while ((w & ~value_mask) == 0) {
      check_overflow(w);
      if (word_.compare_exchange_weak(w, w + 1, std::memory_order_release,
                                      std::memory_order_relaxed))
        return;
    }
    shared_wait_node* granted = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      w = word_.load(std::memory_order_relaxed);
      for (;;) {
        if ((w & ~value_mask) != 0) {  // waiters: the oldest gets the permit
          granted = static_cast<shared_wait_node*>(waiters_.pop_front());
          granted->linked.store(false, std::memory_order_relaxed);
          word_.fetch_sub(one_waiter, std::memory_order_acq_rel);
          break;
        }
        check_overflow(w);
        if (word_.compare_exchange_weak(w, w + 1, std::memory_order_release,
                                        std::memory_order_relaxed))
          return;
      }
    }
    count_grant(stats_, granted->pending, true, stats_.now() - granted->since);
    granted->grant_fn(granted, error_code{});
  }

  // Takes a permit or queues `op`; in the first case completes it at once
  // (through a post).
  void start(shared_wait_node* op, const asio::any_io_executor& waiter_ex) {
    op->core = this;
    stats_.bind(waiter_ex);
    op->since = stats_.now();
    bool ready = false;
    bool shed = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::uint64_t w = word_.load(std::memory_order_relaxed);
      for (;;) {
        if ((w & ~value_mask) == 0 && (w & value_mask) != 0) {
          if (word_.compare_exchange_weak(w, w - 1, std::memory_order_acquire,
                                          std::memory_order_relaxed)) {
            ready = true;
            break;
          }
        } else if (waiters_.size() >= max_waiting_) {  // exact: the list is ours under mu_
          shed = true;
          break;
        } else if (word_.compare_exchange_weak(w, w + one_waiter, std::memory_order_acq_rel,
                                               std::memory_order_relaxed)) {
          waiters_.push_back(op);
          op->linked.store(true, std::memory_order_relaxed);
          break;
        }
      }
    }
    if (ready) {
      count_grant(stats_, op->pending, false, {});
      op->grant_fn(op, error_code{});
    } else if (shed) {
      stats_.shed.fetch_add(1, std::memory_order_relaxed);
      op->grant_fn(op, overloaded_code());  // not queued, nothing taken
    }
  }

  // Removes a waiting op; false if it was already granted or removed.
  bool remove(shared_wait_node* op) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    if (!op->linked.load(std::memory_order_relaxed)) return false;
    waiters_.erase(op);
    op->linked.store(false, std::memory_order_relaxed);
    word_.fetch_sub(one_waiter, std::memory_order_relaxed);
    stats_.cancelled.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  [[nodiscard]] std::size_t value() const noexcept {
    return static_cast<std::size_t>(word_.load(std::memory_order_relaxed) & value_mask);
  }
  [[nodiscard]] std::size_t waiters() const noexcept {
    return static_cast<std::size_t>(word_.load(std::memory_order_relaxed) >> 32);
  }
  [[nodiscard]] std::size_t max_waiters() const {
    std::lock_guard<std::mutex> lock(mu_);
    return waiters_.max_size();
  }
  [[nodiscard]] const asio::any_io_executor& executor() const noexcept { return ex_; }

  [[nodiscard]] shared_stats_sink& stats_sink() noexcept { return stats_; }
  [[nodiscard]] sluice::stats stats() const noexcept {
    const std::size_t v = value();
    return stats_.read(waiters(), initial_ > v ? initial_ - v : 0, initial_);
  }

 private:
  static void check_overflow(std::uint64_t w) {
    if ((w & value_mask) == value_mask)
      throw std::logic_error("sluice::shared_semaphore::release: value would exceed 2^32 - 1");
  }

  asio::any_io_executor ex_;
  std::size_t initial_;
  std::size_t max_waiting_;
  shared_stats_sink stats_;
  std::atomic<std::uint64_t> word_{0};
  mutable std::mutex mu_;
  waiter_list waiters_;  // guarded by mu_
};

// The operation object of one wait on a shared_permit_core: the node, the
// handler, and a work guard on the executor the handler completes on (so that
// executor's context does not run out of work while a release may come from
// another thread). Allocated with Asio's recycling allocator.
//
// Thread rules: the handler's cancellation slot is only touched on the
// waiter's side (armed before the op is queued, emitted by the waiter's own
// executor, cleared by the completion, which runs on that executor). The
// releasing thread only unlinks the op under the core's mutex and posts.
//
// The waiter's loop may die first (stopped, destroyed, while the op waits):
// the op is a hook on that loop's loop_service, attached from its creation
// until its completion is posted. A grant posts only under the loop's lock
// and while the hook is attached, so nothing is posted into a dead loop, and
// the loop's thread cannot destroy the context in the middle of a post. At
// the loop's shutdown, a waiting op is taken out of the core and destroyed
// there (its handler, the suspended frame, goes with the loop); an op
// granted but not yet posted (a release on another thread, between the
// core's mutex and the loop's lock) is expected back: its granting thread
// finds it orphaned, hands the permit on and hands the op back to the
// shutdown, which destroys it (a frame must die while its loop lives).
template <class Handler>
class shared_wait_op final : public shared_wait_node, public loop_hook {
  using executor_type = asio::associated_executor_t<Handler, asio::any_io_executor>;

 public:
  static shared_wait_op* create(Handler&& h, const asio::any_io_executor& fallback) {
    asio::recycling_allocator<shared_wait_op> alloc;
    shared_wait_op* p = alloc.allocate(1);
    try {
      return ::new (static_cast<void*>(p)) shared_wait_op(std::move(h), fallback);
    } catch (...) {
      alloc.deallocate(p, 1);
      throw;
    }
  }

  void arm_cancellation() {
    auto slot = asio::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) slot.template emplace<cancel_handler>(this);
  }

 private:
  shared_wait_op(Handler&& h, const asio::any_io_executor& fallback)
      : handler_(std::move(h)), work_(asio::get_associated_executor(handler_, fallback)) {
    this->grant_fn = &do_grant;
    this->on_end = &on_loop_end;
    life_ = loop_service::life_of_executor(work_.get_executor());
    if (life_) life_->attach(*this);  // false only for a context already shut down
  }

  static void destroy(shared_wait_op* op) noexcept {
    if (op->attached) op->life_->detach(*op);
    op->~shared_wait_op();
    asio::recycling_allocator<shared_wait_op>().deallocate(op, 1);
  }

  // Destroys an op that will never complete, its handler unrun.
  static void discard(shared_wait_op* op) noexcept {
    auto slot = asio::get_associated_cancellation_slot(op->handler_);
    if (slot.is_connected()) slot.clear();
    destroy(op);
  }

  // The waiter's loop is being destroyed (on its destroying thread, under its
  // lock, the hook already detached).
  static void on_loop_end(loop_hook* hook) noexcept {
    auto* op = static_cast<shared_wait_op*>(hook);
    if (op->orphaned_ || (op->linked.load(std::memory_order_acquire) && op->core->remove(op))) {
      discard(op);  // handed back, or still waiting
      return;
    }
    op->orphaned_ = true;  // granted or aborted, not yet posted: do_grant hands it back
    op->life_->expect_hand_back();
  }

  // Owns the op from the grant (or the abort) until its completion runs on the
  // handler's executor, or until that executor drops it unrun.
  struct completer {
    shared_wait_op* op;
    error_code ec;
    completer(shared_wait_op* o, error_code e) noexcept : op(o), ec(e) {}
    completer(completer&& other) noexcept : op(std::exchange(other.op, nullptr)), ec(other.ec) {}
    completer& operator=(completer&&) = delete;
    ~completer() {
      if (op == nullptr) return;
      auto slot = asio::get_associated_cancellation_slot(op->handler_);
      if (slot.is_connected()) slot.clear();
      destroy(op);
    }
    void operator()() {
      shared_wait_op* o = std::exchange(op, nullptr);
      auto slot = asio::get_associated_cancellation_slot(o->handler_);
      if (slot.is_connected()) slot.clear();
      Handler h(std::move(o->handler_));
      destroy(o);  // releases the work guard: the handler runs right now
      std::move(h)(ec);
    }
  };

  static void do_grant(shared_wait_node* base, error_code ec) {
    auto* op = static_cast<shared_wait_op*>(base);
    if (!op->life_) {  // no loop behind the handler (use_future): nothing can die first
      asio::post(op->work_.get_executor(), completer(op, ec));
      return;
    }
    const std::shared_ptr<loop_life> life = op->life_;  // op may be gone after the post
    auto lock = life->lock();
    if (op->orphaned_) {  // the waiter's loop is being destroyed
      lock.unlock();
      if (!ec) op->core->release();  // a grant nobody can use: hand the permit on
      lock.lock();
      life->hand_back(*op);
      return;
    }
    life->detach(*op);
    asio::post(op->work_.get_executor(), completer(op, ec));
  }

  // Runs on the waiter's side, from the handler's cancellation slot: removes
  // the op if it still waits (then nothing can grant it) and completes it
  // from a post (a slot handler may not clear its own slot).
  struct cancel_handler {
    explicit cancel_handler(shared_wait_op* o) noexcept : op(o) {}
    shared_wait_op* op;
    void operator()(asio::cancellation_type_t type) const {
      if ((type & (asio::cancellation_type::terminal | asio::cancellation_type::partial |
                   asio::cancellation_type::total)) == asio::cancellation_type::none)
        return;
      if (!op->linked.load(std::memory_order_acquire)) return;  // granted or removed
      if (op->core->remove(op)) do_grant(op, asio::error::operation_aborted);
    }
  };

  Handler handler_;
  asio::executor_work_guard<executor_type> work_;
  std::shared_ptr<loop_life> life_;  // of the waiter's context
  bool orphaned_ = false;            // under life_'s lock: expected back by its shutdown
};

// Starts one wait on `core` for `handler`; `pending`: the waiting
// coroutine's, when it counts the grant itself (see pending_grant).
template <class Handler>
void start_shared_wait(shared_permit_core& core, Handler&& handler, const char* what,
                       pending_grant* pending = nullptr) {
  using op_type = shared_wait_op<std::decay_t<Handler>>;
  require_executor<std::decay_t<Handler>>(core.executor(), what);
  if (refuse_cancelled(handler, core.executor())) return;  // cancelled before it called
  std::decay_t<Handler> h(std::forward<Handler>(handler));
  const asio::any_io_executor waiter_ex =
      stats_executor(asio::get_associated_executor(h, core.executor()));
  op_type* op = op_type::create(std::move(h), core.executor());
  op->pending = pending;
  op->arm_cancellation();  // before the op can be granted by another thread
  core.start(op, waiter_ex);
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_SHARED_PERMIT_CORE_HPP
