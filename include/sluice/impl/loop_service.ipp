// SPDX-License-Identifier: BSL-1.0
// A context's end (detail::loop_life::end, loop_service's construction and
// shutdown), compiled once (see SLUICE_SEPARATE_COMPILATION in config.hpp):
// included by detail/loop_service.hpp, or only by <sluice/src.hpp>. Once per
// context: nothing here is on a wait's path.
#ifndef SLUICE_IMPL_LOOP_SERVICE_IPP
#define SLUICE_IMPL_LOOP_SERVICE_IPP

namespace sluice::detail {

void loop_life::end() noexcept {
  std::unique_lock<std::recursive_mutex> lock(mutex_);
  ended_.store(true, std::memory_order_release);
  for (;;) {
    while (loop_hook* h = first_) {
      unlink(first_, *h);
      h->on_end(h);
    }
    while (loop_hook* h = head_) {
      unlink(head_, *h);
      h->on_end(h);
    }
    if (expected_ == 0) return;
    // Wait for a hand_back() (made under the lock: none is missed between
    // the read and the wait).
    const std::uint32_t seen = hand_backs_.load(std::memory_order_acquire);
    lock.unlock();
    hand_backs_.wait(seen, std::memory_order_acquire);
    lock.lock();
  }
}

loop_service::loop_service(asio::execution_context& ctx)
    : asio::execution_context::service(ctx), life_(std::make_shared<loop_life>()) {}

void loop_service::shutdown() {
  life_->end();
}

}  // namespace sluice::detail

#endif  // SLUICE_IMPL_LOOP_SERVICE_IPP
