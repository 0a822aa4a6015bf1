// SPDX-License-Identifier: BSL-1.0
// detail::virtual_clock_service's heap, compiled once (see
// SLUICE_SEPARATE_COMPILATION in config.hpp): included by
// detail/virtual_clock.hpp, or only by <sluice/src.hpp>. Virtual time only: no
// wait on the steady clock calls into this file.
#ifndef SLUICE_IMPL_VIRTUAL_CLOCK_IPP
#define SLUICE_IMPL_VIRTUAL_CLOCK_IPP

namespace sluice::detail {

virtual_clock_service::virtual_clock_service(asio::execution_context& ctx)
    : asio::execution_context::service(ctx), now_(std::make_shared<virtual_now>()) {}

virtual_clock_service::~virtual_clock_service() {
  now_->ended_.store(true, std::memory_order_release);
}

void virtual_clock_service::schedule(virtual_timer_node* n) {
  n->seq = next_seq_++;
  n->heap_index = heap_.size();
  heap_.push_back(n);
  sift_up(n->heap_index);
}

bool virtual_clock_service::cancel(virtual_timer_node* n) noexcept {
  if (n->heap_index == virtual_timer_node::npos) return false;
  std::size_t i = n->heap_index;
  n->heap_index = virtual_timer_node::npos;
  virtual_timer_node* last = heap_.back();
  heap_.pop_back();
  if (i < heap_.size()) {
    heap_[i] = last;
    last->heap_index = i;
    sift_down(i);
    sift_up(last->heap_index);
  }
  return true;
}

void virtual_clock_service::advance_to(clock::time_point t) {
  if (t > now()) now_->value_.store(t, std::memory_order_relaxed);
  while (has_due() && heap_.front()->deadline <= now()) {
    virtual_timer_node* n = heap_.front();
    cancel(n);
    n->fire(n, true, error_code{});
  }
}

void virtual_clock_service::shutdown() {
  while (!heap_.empty()) {
    virtual_timer_node* n = heap_.back();
    cancel(n);
    n->fire(n, false, error_code{});
  }
}

void virtual_clock_service::swap_nodes(std::size_t i, std::size_t j) noexcept {
  std::swap(heap_[i], heap_[j]);
  heap_[i]->heap_index = i;
  heap_[j]->heap_index = j;
}

void virtual_clock_service::sift_up(std::size_t i) noexcept {
  while (i > 0 && before(heap_[i], heap_[(i - 1) / 2])) {
    swap_nodes(i, (i - 1) / 2);
    i = (i - 1) / 2;
  }
}

void virtual_clock_service::sift_down(std::size_t i) noexcept {
  for (;;) {
    std::size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < heap_.size() && before(heap_[l], heap_[m])) m = l;
    if (r < heap_.size() && before(heap_[r], heap_[m])) m = r;
    if (m == i) return;
    swap_nodes(i, m);
    i = m;
  }
}

}  // namespace sluice::detail

#endif  // SLUICE_IMPL_VIRTUAL_CLOCK_IPP
