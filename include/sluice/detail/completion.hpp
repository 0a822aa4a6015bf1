// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_COMPLETION_HPP
#define SLUICE_DETAIL_COMPLETION_HPP

#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>

#include <memory>
#include <new>
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

// Completes `handler` with `args` through its associated executor (falling back
// to `fallback`), never inline: the caller may be inside release()/notify().
// The handler's cancellation slot is cleared first, as Asio requires of an
// operation that completes.
template <class Handler, class Executor, class... Args>
void post_completion(Handler&& handler, const Executor& fallback, Args&&... args) {
  auto slot = asio::get_associated_cancellation_slot(handler);
  if (slot.is_connected()) slot.clear();
  auto ex = asio::get_associated_executor(handler, fallback);
  asio::post(ex, [h = std::forward<Handler>(handler),
                  a = std::make_tuple(std::forward<Args>(args)...)]() mutable {
    std::apply(std::move(h), std::move(a));
  });
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

// Owns an operation between a post and the run of the posted function.
// operator() hands the operation to `Run{}(op)`, which completes it. If the
// execution context is destroyed before the post runs (a loop stopped with a
// cancellation pending), the destructor hands it to `Drop{}(op)` instead,
// which must destroy the operation and its handler (and with it, say, a
// coroutine frame) without running it: nothing leaks. Run and Drop are
// stateless function objects taking Op*; Drop must not throw.
template <class Op, class Run, class Drop>
class owning_post {
 public:
  explicit owning_post(Op* op) noexcept : op_(op) {}
  owning_post(owning_post&& other) noexcept : op_(std::exchange(other.op_, nullptr)) {}
  owning_post& operator=(owning_post&&) = delete;
  ~owning_post() {
    if (op_ != nullptr) Drop{}(op_);
  }
  void operator()() { Run{}(std::exchange(op_, nullptr)); }

 private:
  Op* op_;
};

// A type-erased, move-only completion handler for signature void(Args...).
// Invariant: holds at most one handler; complete() consumes it. The erased
// operation comes from Asio's recycling allocator (the thread's cache of
// recently freed blocks), not the heap: a stream parks and wakes a worker and
// its consumer once per wave of results.
template <class... Args>
class erased_handler {
  struct base {
    virtual void post(Args... args) = 0;
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
    void post(Args... args) override {
      post_completion(std::move(handler), fallback, std::move(args)...);
    }
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
    auto p = std::move(impl_);
    p->post(std::move(args)...);
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

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_COMPLETION_HPP
