// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_AFFINITY_HPP
#define SLUICE_DETAIL_AFFINITY_HPP

#include <sluice/config.hpp>
#include <sluice/detail/loop_service.hpp>

#include <sluice/detail/asio.hpp>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <type_traits>
#include <typeinfo>

namespace sluice::detail {

// Debug-build check that a loop-affine primitive is used serially, from its
// loop (SLUICE_AFFINITY_CHECKS). Compiled out otherwise: the class is empty
// and enter() returns an empty scope.
//
// The primitive's loop is the asio::io_context behind the executor it was
// constructed with, or else behind the first executor it sees: a waiting
// handler's, or the awaiting coroutine's (the awaitable members bind it
// before anything else, so primitives built without an executor are checked
// too). Recognised: io_context::executor_type, a strand of it, an
// any_io_executor holding either. A strand seen that way (at construction or
// later) is remembered as the primitive's strand. Other executors
// (thread_pool, system) are never checked; until a loop is known nothing is.
//
// Each mutating or waiting member runs inside enter(), which aborts with a
// message naming the primitive when
// 1. another thread is inside the same primitive at this moment (an atomic
//    owner token, taken by compare-exchange: a real data race, caught when
//    it happens), or
// 2. the calling thread runs the loop, is not inside the primitive's strand,
//    and the previous call from inside the loop came from another thread:
//    the io_context runs on several threads and nothing serialises the
//    primitive (use a strand), or
// 3. the calling thread does not run the loop, the loop is not stopped, and
//    the last call from inside the loop came from another thread: the loop
//    is (as far as can be told) running elsewhere.
// Accepted: every call inside the strand; set-up before the loop first used
// the primitive; the loop's own thread between run() calls; any thread once
// the loop is stopped (its threads returned from run(): the "joined" pattern).
// Not told apart from a race, so flagged: one io_context run by thread A,
// then (A done) by thread B, outside a strand (rule 2); another thread after
// the loop's thread left run_for()/poll() with work still pending (rule 3).
// Destructors and the const diagnostics are not checked.
//
// The loop is known only while its io_context lives: a hook on the context's
// loop_service forgets it (and the strand copy) at the context's shutdown, so
// a primitive may outlive its loop and serve the next one, which it then
// learns as above.
//
// All state is atomic; the check itself is ThreadSanitizer-clean.
class affinity {
 public:
  static constexpr bool enabled = SLUICE_AFFINITY_CHECKS != 0;

#if SLUICE_AFFINITY_CHECKS
  // Marks the calling thread inside the primitive until destroyed.
  class scope {
   public:
    explicit scope(affinity* a) noexcept : a_(a) {}
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;
    ~scope() { a_->leave(); }

   private:
    affinity* a_;
  };
#else
  class scope {
   public:
    ~scope() {}  // user-provided: no unused-variable warning, still free
  };
#endif

#if SLUICE_AFFINITY_CHECKS
  affinity() noexcept {
    hook_.self = this;
  }
  ~affinity() {
    if (life_) life_->detach(hook_);
  }
#else
  affinity() = default;
#endif
  affinity(const affinity&) = delete;
  affinity& operator=(const affinity&) = delete;

  // Learns the loop (and strand) from `ex` if none is known yet.
  template <class Executor>
  void bind(const Executor& ex) noexcept {
#if SLUICE_AFFINITY_CHECKS
    asio::io_context* ctx = nullptr;
    const io_strand* strand = nullptr;
    describe(ex, ctx, strand);
    if (ctx == nullptr) return;
    asio::io_context* known = nullptr;
    if (!ctx_.compare_exchange_strong(known, ctx, std::memory_order_acq_rel)) {
      if (known != ctx) return;  // a strand of another loop says nothing about ours
    } else {
      watch(*ctx);
    }
    if (strand == nullptr) return;
    unsigned char state = strand_none;
    if (strand_state_.compare_exchange_strong(state, strand_writing, std::memory_order_acquire)) {
      strand_.emplace(*strand);
      strand_state_.store(strand_ready, std::memory_order_release);
    }
#else
    (void)ex;
#endif
  }

  // Enters the primitive `what` (a name for the message) from this thread;
  // aborts on a violation (see above).
  [[nodiscard]] scope enter(const char* what) noexcept {
#if SLUICE_AFFINITY_CHECKS
    if (const char* why = violation()) fail(what, why);
    const std::uintptr_t self = this_thread_token();
    std::uintptr_t holder = 0;
    if (!inside_.compare_exchange_strong(holder, self, std::memory_order_acquire) &&
        holder != self) {
      fail(what, overlap_message);
    }
    ++depth_;  // only the holder of inside_ touches depth_
    return scope(this);
#else
    (void)what;
    return scope{};
#endif
  }

  // A check at this instant, for code that cannot hold a scope across its
  // work (a coroutine that suspends): the rules of enter(), then leaves.
  void check(const char* what) noexcept {
    const scope in = enter(what);
  }

  // The reason a call from this thread, now, breaks rules 2 or 3, or null.
  // Records this thread as the loop's when it runs the loop.
  const char* violation() noexcept {
#if SLUICE_AFFINITY_CHECKS
    asio::io_context* ctx = ctx_.load(std::memory_order_acquire);
    if (ctx == nullptr) return nullptr;
    const std::uintptr_t self = this_thread_token();
    if (strand_state_.load(std::memory_order_acquire) == strand_ready &&
        strand_->running_in_this_thread()) {
      loop_thread_.store(self, std::memory_order_release);
      return nullptr;
    }
    if (ctx->get_executor().running_in_this_thread()) {
      const std::uintptr_t previous = loop_thread_.exchange(self, std::memory_order_acq_rel);
      return previous != 0 && previous != self ? switch_message : nullptr;
    }
    const std::uintptr_t last = loop_thread_.load(std::memory_order_acquire);
    if (last == 0 || last == self || ctx->stopped()) return nullptr;
    return elsewhere_message;
#else
    return nullptr;
#endif
  }

#if SLUICE_AFFINITY_CHECKS
  static constexpr const char* overlap_message = "entered by two threads at once";
  static constexpr const char* switch_message =
      "used from two threads that both run its io_context, outside a strand";
  static constexpr const char* elsewhere_message =
      "used from a thread that is not running its loop while the loop runs on another thread";
#endif

 private:
#if SLUICE_AFFINITY_CHECKS
  using io_executor = asio::io_context::executor_type;
  using io_strand = asio::strand<io_executor>;
  static constexpr unsigned char strand_none = 0, strand_writing = 1, strand_ready = 2;

  // A distinct value per thread, never reused (a thread id or a thread_local's
  // address may be reused by a later thread), never 0.
  static std::uintptr_t this_thread_token() noexcept {
    static std::atomic<std::uintptr_t> next{1};
    static thread_local const std::uintptr_t token = next.fetch_add(1, std::memory_order_relaxed);
    return token;
  }

  // Learns of the end of `ctx` (just bound by this thread's compare-exchange).
  void watch(asio::io_context& ctx) noexcept {
    try {
      auto life = loop_service::life_of(ctx);
      if (life_) life_->detach(hook_);
      life_ = std::move(life);
      life_->attach(hook_);
    } catch (...) {
      // No service (out of memory): the loop is kept, as before there was one.
    }
  }

  // At the loop's shutdown: forget it, and drop the strand copy while the
  // strand's service still lives.
  static void on_loop_end(loop_hook* h) noexcept {
    affinity* a = static_cast<hook*>(h)->self;
    a->strand_state_.store(strand_none, std::memory_order_release);
    a->strand_.reset();
    a->loop_thread_.store(0, std::memory_order_release);
    a->ctx_.store(nullptr, std::memory_order_release);
  }

  void leave() noexcept {
    if (--depth_ == 0) inside_.store(0, std::memory_order_release);
  }

  [[noreturn]] static void fail(const char* what, const char* why) noexcept {
    std::fprintf(stderr,
                 "sluice: %s %s. sluice primitives are loop-affine and not thread-safe: use "
                 "each from one thread, or from one strand (asio::make_strand) when the "
                 "io_context runs on several threads, and post calls from other threads to "
                 "it (asio::post)\n",
                 what, why);
    std::fflush(stderr);
    std::abort();
  }

  // The io_context (and strand) behind an executor a coroutine or a user
  // normally holds; null otherwise.
  template <class Executor>
  static void describe(const Executor& ex, asio::io_context*& ctx,
                       const io_strand*& strand) noexcept {
    if constexpr (std::is_same_v<Executor, io_executor>) {
      ctx = &ex.context();
    } else if constexpr (std::is_same_v<Executor, io_strand>) {
      ctx = &ex.get_inner_executor().context();
      strand = &ex;
    } else if constexpr (std::is_same_v<Executor, asio::any_io_executor>) {
      if (!ex) return;
      if (const auto* e = target_of<io_executor>(ex)) {
        ctx = &e->context();
      } else if (const auto* s = target_of<io_strand>(ex)) {
        ctx = &s->get_inner_executor().context();
        strand = s;
      }
    }
  }

  // The executor an any_io_executor holds, if it is a T. Asio 1.22's
  // target<T>() does not check the type (it casts whatever is held), so the
  // type is compared first. Without RTTI nothing is recognised (no checks).
  template <class T>
  static const T* target_of(const asio::any_io_executor& ex) noexcept {
#if defined(ASIO_NO_TYPEID) || defined(BOOST_ASIO_NO_TYPEID)
    (void)ex;
    return nullptr;
#else
    return ex.target_type() == typeid(T) ? ex.template target<T>() : nullptr;
#endif
  }

  struct hook : loop_hook {
    hook() noexcept { on_end = &on_loop_end; }
    affinity* self = nullptr;
  };

  std::atomic<asio::io_context*> ctx_{nullptr};
  std::shared_ptr<loop_life> life_;  // of ctx_'s context; written by the thread that bound it
  hook hook_;
  std::atomic<unsigned char> strand_state_{strand_none};
  std::optional<io_strand> strand_;             // written once, before strand_state_ = ready
  std::atomic<std::uintptr_t> loop_thread_{0};  // last thread that called from inside the loop
  std::atomic<std::uintptr_t> inside_{0};       // thread inside the primitive now, or 0
  unsigned depth_ = 0;                          // its nesting depth
#endif
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_AFFINITY_HPP
