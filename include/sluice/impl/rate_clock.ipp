// SPDX-License-Identifier: BSL-1.0
// detail::rate_timer's steady-timer side, compiled once (see
// SLUICE_SEPARATE_COMPILATION in config.hpp): included by detail/rate_clock.hpp,
// or only by <sluice/src.hpp>. Only this file needs Asio's steady timer.
#ifndef SLUICE_IMPL_RATE_CLOCK_IPP
#define SLUICE_IMPL_RATE_CLOCK_IPP

#include <sluice/detail/asio_timer.hpp>

namespace sluice::detail {

struct rate_timer::real_state {
  real_state(rate_timer* o, const asio::any_io_executor& ex, asio::execution_context& c)
      : owner(o), ctx(&c), timer(ex) {}
  rate_timer* owner;
  asio::execution_context* ctx;
  asio::steady_timer timer;
  std::uint64_t generation = 0;
};

void rate_timer::arm(virtual_clock_service* v, const asio::any_io_executor& ex,
                     clock::time_point t) {
  if (v != nullptr) {
    if (armed_ && at_ == t) return;
    disarm();
    vclock_ = v;
    node_.deadline = t;
    v->schedule(&node_);
  } else {
    auto& ctx = asio::query(ex, asio::execution::context_as<asio::execution_context&>);
    if (real_ && real_->ctx != &ctx) let_go();  // the head waits on another loop now
    if (armed_ && at_ == t) return;
    vclock_ = nullptr;
    if (!real_) real_ = std::make_shared<real_state>(this, ex, ctx);
    real_->timer.expires_at(t);  // cancels a pending wait (stale by its generation)
    real_->timer.async_wait([s = real_, g = ++real_->generation](const error_code&) {
      if (s->owner == nullptr || s->generation != g) return;
      s->owner->armed_ = false;
      s->owner->fn_(s->owner->context_);
    });
  }
  armed_ = true;
  at_ = t;
}

void rate_timer::disarm() noexcept {
  if (armed_ && vclock_ != nullptr) {
    // Not in the heap any more if the clock was shut down (the loop died).
    if (node_.heap_index != virtual_timer_node::npos) vclock_->cancel(&node_);
  }
  armed_ = false;
  let_go();
}

void rate_timer::let_go() noexcept {
  if (!real_) return;
  real_->owner = nullptr;
  if (armed_) {
    armed_ = false;
    real_->timer.cancel();
  }
  real_.reset();
}

}  // namespace sluice::detail

#endif  // SLUICE_IMPL_RATE_CLOCK_IPP
