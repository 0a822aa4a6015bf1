// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_CHILD_SET_HPP
#define SLUICE_DETAIL_CHILD_SET_HPP

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/loop_service.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <new>
#include <system_error>
#include <type_traits>
#include <utility>

namespace sluice::detail {

// Where one child's cancellation handler lives. co_spawn puts the handler it
// needs (its proxy cancellation state) into the completion handler's
// associated slot; a child_slot is a slot of our own (Asio's CancellationSlot
// requirements) that constructs it in place here, where Asio's
// cancellation_signal would allocate it. A handler too big for the buffer is
// allocated. Invariant: ops_ != nullptr exactly while a handler is held.
class child_slot_storage {
 public:
  child_slot_storage() = default;
  child_slot_storage(const child_slot_storage&) = delete;
  child_slot_storage& operator=(const child_slot_storage&) = delete;
  ~child_slot_storage() { clear(); }

  [[nodiscard]] bool has_handler() const noexcept { return ops_ != nullptr; }

  template <class H, class... A>
  H& emplace(A&&... a) {
    clear();
    H* h;
    if constexpr (fits<H>) {
      h = ::new (static_cast<void*>(buf_)) H(std::forward<A>(a)...);
    } else {
      h = new H(std::forward<A>(a)...);
    }
    obj_ = h;
    ops_ = &ops_for<H>;
    return *h;
  }

  void emit(asio::cancellation_type type) {
    if (ops_ != nullptr) ops_->call(obj_, type);
  }

  void clear() noexcept {
    if (ops_ != nullptr) std::exchange(ops_, nullptr)->destroy(obj_);
  }

 private:
  struct ops {
    void (*call)(void*, asio::cancellation_type);
    void (*destroy)(void*) noexcept;
  };
  static constexpr std::size_t buffer_size = 2 * sizeof(void*);
  template <class H>
  static constexpr bool fits = sizeof(H) <= buffer_size && alignof(H) <= alignof(void*);
  template <class H>
  static void call(void* h, asio::cancellation_type type) {
    (*static_cast<H*>(h))(type);
  }
  template <class H>
  static void destroy(void* h) noexcept {
    if constexpr (fits<H>) {
      static_cast<H*>(h)->~H();
    } else {
      delete static_cast<H*>(h);
    }
  }
  template <class H>
  static constexpr ops ops_for{&call<H>, &destroy<H>};

  alignas(void*) unsigned char buf_[buffer_size];
  void* obj_ = nullptr;
  const ops* ops_ = nullptr;
};

// A CancellationSlot over a child_slot_storage (what
// asio::bind_cancellation_slot binds to a child's completion handler).
class child_slot {
 public:
  explicit child_slot(child_slot_storage* s) noexcept : s_(s) {}
  [[nodiscard]] bool is_connected() const noexcept { return s_ != nullptr; }
  [[nodiscard]] bool has_handler() const noexcept { return s_ != nullptr && s_->has_handler(); }
  template <class H, class... A>
  H& emplace(A&&... a) {
    return s_->template emplace<H>(std::forward<A>(a)...);
  }
  template <class H>
  std::decay_t<H>& assign(H&& h) {
    return s_->template emplace<std::decay_t<H>>(std::forward<H>(h));
  }
  void clear() noexcept {
    if (s_ != nullptr) s_->clear();
  }
  friend bool operator==(const child_slot&, const child_slot&) = default;

 private:
  child_slot_storage* s_;
};

// The child coroutines of one call (the workers of a gather, of a stream),
// child i cancellable through its own slot. It
// grows as children are added (a deque: slots never move).
// Held by shared_ptr: by the call and by each running child, so a child that
// outlives its parent's frame (the loop is being destroyed) touches no freed
// state.
//
// Invariants: running_ counts children started and not yet completed; child i
// runs exactly while slots_[i] holds a handler (co_spawn puts it there when the
// child starts; on_done clears it); joiner_ is set only while a join waits and
// running_ > 0; stopping_ is sticky.
class child_set : public std::enable_shared_from_this<child_set> {
 public:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);

  child_set() = default;
  // A new set. (The templates below are compiled once for Asio's default
  // executor with SLUICE_SEPARATE_COMPILATION: extern template, src.hpp.)
  template <class = void>
  static std::shared_ptr<child_set> make();

  child_set(const child_set&) = delete;
  child_set& operator=(const child_set&) = delete;

  // Children started so far (running or finished).
  [[nodiscard]] std::size_t size() const noexcept { return slots_.size(); }
  [[nodiscard]] std::size_t running() const noexcept { return running_; }
  [[nodiscard]] bool running(std::size_t i) const noexcept { return slots_[i].has_handler(); }
  // True once cancel_all() was called (a failure, a cancelled parent, a close).
  [[nodiscard]] bool stopping() const noexcept { return stopping_; }
  // True once the joining parent was cancelled.
  [[nodiscard]] bool parent_cancelled() const noexcept { return parent_cancelled_; }
  // An exception that escaped a child coroutine itself (children catch their
  // tasks' exceptions; this is only set for failures of the machinery).
  [[nodiscard]] std::exception_ptr escaped() const noexcept { return escaped_; }

  // Starts a child on `ex`; returns its index.
  template <class Executor>
  std::size_t spawn(const Executor& ex, asio::awaitable<void, Executor> child);

  // Requests cancellation of child i if it is running.
  void cancel(std::size_t i, asio::cancellation_type type = asio::cancellation_type::terminal) {
    slots_[i].emit(type);
  }

  // Stops the set: stopping() becomes true and every running child except
  // `except` gets `type` (none: stop without cancelling anyone).
  SLUICE_DECL void cancel_all(std::size_t except = none,
                              asio::cancellation_type type = asio::cancellation_type::terminal);

  // The joining parent was cancelled: parent_cancelled() becomes true and every
  // running child is cancelled (terminal); the join completes with
  // operation_aborted.
  void cancel_from_parent() {
    parent_cancelled_ = true;
    cancel_all();
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
              if (type != asio::cancellation_type::none) s->cancel_from_parent();
            });
          }
          self->joiner_.hold(std::move(handler), ex);
        },
        token);
  }

  // async_join() through `redirect_error(use_awaitable, ec)`: the join of
  // a coroutine, `ec` set instead of thrown.
  template <class Executor>
  asio::awaitable<void, Executor> join(const Executor& ex, error_code& ec);

 private:
  // The child's completion handler; its cancellation slot is the child's
  // storage. The slot is a member, not an asio::bind_cancellation_slot
  // binder: for a handler with no associated executor, Asio 1.24+ keeps the
  // smallest cancellation handler (a signal, emitted at once) instead of one
  // that holds an executor and dispatches each emit.
  struct done_handler {
    using cancellation_slot_type = child_slot;
    std::shared_ptr<child_set> self;
    child_slot_storage* slot;
    std::size_t i;
    [[nodiscard]] child_slot get_cancellation_slot() const noexcept { return child_slot(slot); }
    void operator()(std::exception_ptr e) const { self->on_done(i, std::move(e)); }
  };

  SLUICE_DECL void on_done(std::size_t i, std::exception_ptr e);

  std::deque<child_slot_storage> slots_;
  std::size_t running_ = 0;
  bool stopping_ = false;
  bool parent_cancelled_ = false;
  std::exception_ptr escaped_;
  loop_held_handler<error_code> joiner_;  // let go if its loop dies first
};

template <class>
std::shared_ptr<child_set> child_set::make() {
  return std::make_shared<child_set>();
}

template <class Executor>
std::size_t child_set::spawn(const Executor& ex, asio::awaitable<void, Executor> child) {
  const std::size_t i = slots_.size();
  slots_.emplace_back();
  ++running_;
  asio::co_spawn(ex, std::move(child), done_handler{shared_from_this(), &slots_[i], i});
  return i;
}

template <class Executor>
asio::awaitable<void, Executor> child_set::join(const Executor& ex, error_code& ec) {
  return async_join(ex, asio::redirect_error(asio::use_awaitable_t<Executor>{}, ec));
}

#if defined(SLUICE_SEPARATE_COMPILATION)
extern template std::shared_ptr<child_set> child_set::make<void>();
extern template std::size_t child_set::spawn(const asio::any_io_executor&, asio::awaitable<void>);
extern template asio::awaitable<void> child_set::join(const asio::any_io_executor&, error_code&);
#endif

}  // namespace sluice::detail

#if SLUICE_HEADER_DEFS
#include <sluice/impl/child_set.ipp>
#endif

#endif  // SLUICE_DETAIL_CHILD_SET_HPP
