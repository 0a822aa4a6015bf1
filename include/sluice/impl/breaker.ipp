// SPDX-License-Identifier: BSL-1.0
// detail::breaker_core's cold side (construction, stats, the state
// transitions), compiled once (see SLUICE_SEPARATE_COMPILATION in config.hpp):
// included by breaker.hpp, or only by <sluice/src.hpp>.
#ifndef SLUICE_IMPL_BREAKER_IPP
#define SLUICE_IMPL_BREAKER_IPP

namespace sluice::detail {

breaker_core::breaker_core(breaker_options o) : opt_(std::move(o)) {
  const auto bad_rate = [](double r) {
    return !(r > 0.0 && r <= 1.0);
  };
  if (bad_rate(opt_.failure_rate) || bad_rate(opt_.slow_call_rate))
    throw std::invalid_argument("sluice::breaker: the rates must be in (0, 1]");
  if (opt_.window == 0 && opt_.window_time <= clock::duration::zero())
    throw std::invalid_argument("sluice::breaker: the window must hold at least one call");
  if (opt_.half_open_calls == 0)
    throw std::invalid_argument("sluice::breaker: half_open_calls must be at least 1");
  if (opt_.open_for < clock::duration::zero() || opt_.slow_call < clock::duration::zero())
    throw std::invalid_argument("sluice::breaker: open_for and slow_call must be >= 0");
}

breaker_stats breaker_core::stats(clock::time_point now) {
  std::lock_guard lock(mutex_);
  expire(now);
  breaker_stats s = stats_;
  s.state = state_;
  s.window_calls = window_calls_;
  s.window_failures = window_failures_;
  s.window_slow = window_slow_;
  return s;
}

breaker_core::change breaker_core::move_to(breaker_state to, clock::time_point now) {
  const change c{state_, to};
  state_ = to;
  ++generation_;
  window_.clear();
  window_calls_ = window_failures_ = window_slow_ = 0;
  trials_started_ = trials_done_ = trial_failures_ = trial_slow_ = 0;
  if (to == breaker_state::open) {
    opened_at_ = now;
    ++stats_.opened;
  }
  return c;
}

}  // namespace sluice::detail

#endif  // SLUICE_IMPL_BREAKER_IPP
