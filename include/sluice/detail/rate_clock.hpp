// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_RATE_CLOCK_HPP
#define SLUICE_DETAIL_RATE_CLOCK_HPP

// The time source of the rate limiters: where a limiter reads the time
// (clock_source) and the one timer that wakes its head waiter (rate_timer).
// The grant logic over them is in rate_core.hpp.

#include <sluice/config.hpp>
#include <sluice/detail/virtual_clock.hpp>

#include <sluice/detail/asio.hpp>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>

namespace sluice::detail {

// Where a time-based limiter reads the time: the virtual clock of an execution
// context, or the steady clock. Bound once, from the limiter's executor or
// from the first waiter's; a later use on the other kind of clock, or on a
// virtual clock after the one it was bound to ended (a new virtual loop, even
// at the dead one's address), is a std::logic_error (the recorded times would
// not compare). Any number of steady-clock contexts may follow each other:
// they share one clock. The time is read through virtual_now, never the
// service: after its context ended, the time it ended at.
class clock_source {
 public:
  void bind(const asio::any_io_executor& ex, const char* who) {
    if (!ex) return;
    auto& ctx = asio::query(ex, asio::execution::context_as<asio::execution_context&>);
    const bool ended = vnow_ != nullptr && vnow_->ended();
    if (bound_ && &ctx == ctx_ && !ended) return;  // the usual case: no service lookup
    virtual_clock_service* v = find_virtual_clock(ctx);
    if (!bound_) {
      bound_ = true;
      vclock_ = v;
      vnow_ = v != nullptr ? v->shared_now() : nullptr;
    } else if (v != vclock_ || ended) {
      throw std::logic_error(std::string(who) +
                             ": used on a different clock than before (virtual time after the "
                             "steady clock, or another virtual loop); construct it with the "
                             "executor of the loop that uses it");
    }
    ctx_ = &ctx;
  }
  // A synchronous call (try_acquire) before any binding reads the steady clock.
  void bind_if_unbound() noexcept { bound_ = true; }
  void adopt(const clock_source& other) noexcept {
    if (!bound_ && other.bound_) *this = other;
  }
  [[nodiscard]] bool bound() const noexcept { return bound_; }
  // The clock bound (valid until its context ends; then bind() throws first).
  [[nodiscard]] virtual_clock_service* virtual_clock() const noexcept { return vclock_; }
  [[nodiscard]] clock::time_point now() const noexcept {
    return vnow_ != nullptr ? vnow_->now() : clock::now();
  }

 private:
  bool bound_ = false;
  virtual_clock_service* vclock_ = nullptr;
  std::shared_ptr<const virtual_now> vnow_;
  asio::execution_context* ctx_ = nullptr;  // the context last seen (a cache, never dereferenced)
};

// The single timer of one limiter: calls fn(context) at the armed deadline. On
// a virtual clock it is a node in the clock's heap (seen by the autojump); on
// the steady clock an asio::steady_timer on the context of the waiter it
// wakes (the head waiter's executor), made at arm() and let go at disarm().
//
// The steady timer belongs to the wait, not to the limiter: the limiter holds
// it only while someone waits (service() ends every change of the head in
// arm() or disarm()), so a limiter that outlives its io_context, or serves one
// io_context after another, holds nothing of a loop between waits. A timer let
// go while its wait is pending is kept alive by that wait's handler, which
// finds no owner and does nothing; if the loop dies first, the loop destroys
// that handler, and with it the timer, as it destroys every pending handler.
//
// Invariants: armed_ is true while a firing is pending for at_; real_ is
// non-null only while armed on the steady clock or between a firing and the
// next arm()/disarm(); a stale steady-timer completion (generation mismatch,
// or the owner gone) does nothing.
class rate_timer {
 public:
  rate_timer(void (*fn)(void*), void* context) noexcept : fn_(fn), context_(context) {
    node_.owner = this;
    node_.fire = &fire_virtual;
  }
  rate_timer(const rate_timer&) = delete;
  rate_timer& operator=(const rate_timer&) = delete;
  ~rate_timer() { disarm(); }

  // Arms for `t`: on the virtual clock `v`, or (v null) on a steady timer of
  // the context of `ex`, the executor of the waiter it wakes.
  SLUICE_DECL void arm(virtual_clock_service* v, const asio::any_io_executor& ex,
                       clock::time_point t);

  // Stops a pending firing and lets go of the steady timer.
  SLUICE_DECL void disarm() noexcept;

 private:
  struct node : virtual_timer_node {
    rate_timer* owner = nullptr;
  };
  struct real_state;  // the steady timer (impl/rate_clock.ipp)

  // Drops the steady timer; a pending wait completes (aborted) to nobody.
  SLUICE_DECL void let_go() noexcept;

  static void fire_virtual(virtual_timer_node* n, bool invoke, error_code) {
    rate_timer* self = static_cast<node*>(n)->owner;
    self->armed_ = false;
    if (invoke) self->fn_(self->context_);
  }

  void (*fn_)(void*);
  void* context_;
  node node_;
  virtual_clock_service* vclock_ = nullptr;
  std::shared_ptr<real_state> real_;
  bool armed_ = false;
  clock::time_point at_{};
};

}  // namespace sluice::detail

#if SLUICE_HEADER_DEFS
#include <sluice/impl/rate_clock.ipp>
#endif

#endif  // SLUICE_DETAIL_RATE_CLOCK_HPP
