// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_COMPLETION_HPP
#define SLUICE_DETAIL_COMPLETION_HPP

#include <sluice/config.hpp>
#include <sluice/detail/loop_post.hpp>

#include <sluice/detail/asio.hpp>

#include <memory>
#include <new>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace sluice::detail {

// True if `handler` resumes a coroutine whose cancellation was requested
// before the call (a caller that runs on with throw_if_cancelled(false)).
// Asio's coroutine handler exposes its coroutine's cancellation state; a
// cancellation slot cannot say whether it was already emitted, so other
// handlers (callbacks, futures) are never taken for cancelled.
template <class Handler>
bool cancel_requested(const Handler& handler) noexcept {
  if constexpr (requires { handler.get_cancellation_state().cancelled(); }) {
    return handler.get_cancellation_state().cancelled() != asio::cancellation_type::none;
  } else {
    return false;
  }
}

// The start of every awaitable wait (also of its path that would not wait):
// a coroutine whose cancellation was already requested is refused at once,
// holding and taking nothing. `what` names the call in the exception.
inline void refuse_if_cancelled(const asio::cancellation_state& state, const char* what) {
  if (state.cancelled() != asio::cancellation_type::none)
    throw system_error(asio::error::operation_aborted, what);
}

// Owns an operation between a post and the run of the posted function.
// operator() hands the operation to `run(op)`, which completes it. If the
// execution context is destroyed before the post runs (a loop stopped with a
// cancellation pending), the destructor hands it to `drop(op)` instead, which
// must destroy the operation and its handler (and with it, say, a coroutine
// frame) without running it: nothing leaks; drop must not throw. One type for
// every operation (owning_post() makes one): an executor compiles its posting
// machinery once for all of them (issue 32).
class op_post {
 public:
  using fn = void (*)(void*);
  op_post(void* op, fn run, fn drop) noexcept : op_(op), run_(run), drop_(drop) {}
  op_post(op_post&& other) noexcept
      : op_(std::exchange(other.op_, nullptr)), run_(other.run_), drop_(other.drop_) {}
  op_post& operator=(op_post&&) = delete;
  ~op_post() {
    if (op_ != nullptr) drop_(op_);
  }
  void operator()() { run_(std::exchange(op_, nullptr)); }

 private:
  void* op_;
  fn run_;
  fn drop_;
};

// An op_post of `op`: `Run{}(op)` when it runs, `Drop{}(op)` if it never
// does. Run and Drop are stateless function objects taking Op*.
template <class Op, class Run, class Drop>
op_post owning_post(Op* op) noexcept {
  return op_post(
      op, [](void* p) { Run{}(static_cast<Op*>(p)); },
      [](void* p) { Drop{}(static_cast<Op*>(p)); });
}

// A type-erased, move-only completion handler for signature void(Args...).
// Invariant: holds at most one handler; complete() consumes it. The erased
// operation comes from Asio's recycling allocator (the thread's cache of
// recently freed blocks), not the heap: a stream parks and wakes a worker and
// its consumer once per wave of results.
template <class... Args>
class erased_handler {
  struct base {
    virtual void prepare(Args... args) = 0;  // may throw: still owned by the caller
    virtual void post() = 0;                 // owns itself from here on
    virtual void invoke(Args... args) = 0;
    virtual void clear_slot() = 0;
    virtual void destroy() noexcept = 0;

   protected:
    ~base() = default;
  };
  template <class Handler, class Executor>
  struct impl final : base {
    impl(Handler&& h, const Executor& ex) : handler(std::move(h)), fallback(ex) {}
    ~impl() = default;
    // Keeps the arguments until it runs; the handler's slot is cleared first.
    void prepare(Args... args) override {
      clear_slot();
      this->args.emplace(std::move(args)...);
    }
    // Posts itself: one op_post type for every handler (issue 32).
    void post() override {
      auto posted = owning_post<impl, run_posted, drop_posted>(this);
      post_to(asio::get_associated_executor(handler, fallback), std::move(posted));
    }
    struct run_posted {
      void operator()(impl* p) const {
        auto a = std::move(*p->args);
        Handler h(std::move(p->handler));
        p->destroy();
        std::apply(std::move(h), std::move(a));
      }
    };
    struct drop_posted {
      void operator()(impl* p) const noexcept { p->destroy(); }
    };
    void invoke(Args... args) override {
      clear_slot();
      std::move(handler)(std::move(args)...);
    }
    void clear_slot() override {
      auto slot = asio::get_associated_cancellation_slot(handler);
      if (slot.is_connected()) slot.clear();
    }
    void destroy() noexcept override {
      asio::recycling_allocator<impl> alloc;
      this->~impl();
      alloc.deallocate(this, 1);
    }
    Handler handler;
    Executor fallback;
    std::optional<std::tuple<Args...>> args;  // set by post()
  };
  struct destroyer {
    void operator()(base* p) const noexcept { p->destroy(); }
  };
  using owner = std::unique_ptr<base, destroyer>;

  template <class Handler, class Executor>
  static owner make(Handler&& h, const Executor& fallback) {
    using op = impl<std::decay_t<Handler>, Executor>;
    asio::recycling_allocator<op> alloc;
    op* p = alloc.allocate(1);
    try {
      return owner(::new (static_cast<void*>(p)) op(std::forward<Handler>(h), fallback));
    } catch (...) {
      alloc.deallocate(p, 1);
      throw;
    }
  }

 public:
  erased_handler() = default;
  template <class Handler, class Executor>
  erased_handler(Handler&& h, const Executor& fallback)
      : impl_(make(std::forward<Handler>(h), fallback)) {}

  explicit operator bool() const noexcept { return impl_ != nullptr; }

  // Posts the completion; the handler is released.
  void complete(Args... args) {
    impl_->prepare(std::move(args)...);
    impl_.release()->post();
  }

  // The operation is completing: no cancellation can reach it any more (Asio
  // requires the slot cleared before the completion is posted).
  void clear_slot() { impl_->clear_slot(); }

  // Runs the handler now, on this thread; the handler is released. Only from
  // a function that already runs on the handler's executor through a post of
  // its own (never from a notifying call: waiters are not resumed inline).
  void complete_here(Args... args) {
    auto p = std::move(impl_);
    p->invoke(std::move(args)...);
  }

 private:
  owner impl_;
};

// The completion handler of a coroutine awaiting an operation of signature
// `Sig` (asio::use_awaitable on Asio's default executor): what sluice
// compiles once for it with SLUICE_SEPARATE_COMPILATION.
template <class Sig>
using awaitable_handler_t = typename asio::async_result<asio::use_awaitable_t<>, Sig>::handler_type;

#if defined(SLUICE_SEPARATE_COMPILATION)
extern template class erased_handler<>;
#endif

// Completes `handler` with `args` through its associated executor (falling back
// to `fallback`), never inline: the caller may be inside release()/notify().
// The handler's cancellation slot is cleared first, as Asio requires of an
// operation that completes.
// Through an erased_handler, so every completion sluice posts is one op_post
// type (each posted function type costs an -O0 object some 60 functions of
// Asio's; issue 32). Not on a hand-off path: waits post their handler_op.
template <class Handler, class Executor, class... Args>
void post_completion(Handler&& handler, const Executor& fallback, Args... args) {
  erased_handler<Args...>(std::forward<Handler>(handler), fallback).complete(std::move(args)...);
}

// The start of every wait that takes a completion handler and has no list
// of its own (start_wait does the same): completes `handler` at once, through
// a post, with operation_aborted if its coroutine's cancellation was already
// requested; true if it did (the caller then starts and takes nothing).
template <class Handler, class Executor>
bool refuse_cancelled(Handler& handler, const Executor& fallback) {
  if (!cancel_requested(handler)) return false;
  post_completion(std::move(handler), fallback, error_code(asio::error::operation_aborted));
  return true;
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_COMPLETION_HPP
