// SPDX-License-Identifier: BSL-1.0
// detail::wait_bound's timer and its make(), compiled once (see
// SLUICE_SEPARATE_COMPILATION in config.hpp: make<void> is instantiated by
// <sluice/src.hpp>): included by detail/wait_bound.hpp, or only by
// <sluice/src.hpp>.
#ifndef SLUICE_IMPL_WAIT_BOUND_IPP
#define SLUICE_IMPL_WAIT_BOUND_IPP

#include <sluice/detail/rate_clock.hpp>

namespace sluice::detail {

// wait_bound's timer: on the virtual clock of the last waiter queued, or on a
// steady timer of its executor's context.
class wait_bound_timer final : public wait_bound {
 public:
  wait_bound_timer(const shed_options& o, void (*expire)(void*), void* context)
      : wait_bound(o), timer_(expire, context) {}

  void queued(bool alone, clock::time_point since, virtual_clock_service* v,
              const asio::any_io_executor& ex) override {
    if (!timed() || (v == nullptr && !ex)) return;
    vclock_ = v;
    ex_ = ex;
    if (alone) timer_.arm(v, ex, deadline(since));
  }
  void idle() noexcept override {
    timer_.disarm();
    ex_ = {};
  }

 private:
  void rearm(clock::time_point d) override { timer_.arm(vclock_, ex_, d); }

  rate_timer timer_;
  virtual_clock_service* vclock_ = nullptr;
  asio::any_io_executor ex_;  // the last queued waiter's: where a steady timer runs
};

template <class Lazy>
std::unique_ptr<wait_bound> wait_bound::make(const shed_options& o, const char* who,
                                             void (*expire)(void*), void* context) {
  check(o, who);
  if (o.max_waiting == shed_options{}.max_waiting && o.max_wait == clock::duration::max())
    return nullptr;
  return std::make_unique<wait_bound_timer>(o, expire, context);
}

}  // namespace sluice::detail

#endif  // SLUICE_IMPL_WAIT_BOUND_IPP
