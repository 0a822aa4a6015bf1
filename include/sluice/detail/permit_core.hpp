// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_PERMIT_CORE_HPP
#define SLUICE_DETAIL_PERMIT_CORE_HPP

#include <sluice/config.hpp>
#include <sluice/detail/affinity.hpp>
#include <sluice/detail/waiter_list.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

namespace sluice::detail {

// The counting core shared by semaphore, bounded_semaphore and lock.
//
// Invariants: a waiter exists only while value_ == 0 (release() hands its
// permit straight to the oldest waiter instead of incrementing), so
// try_acquire() can never barge past a waiter; when bounded_, value_ <= bound_.
class permit_core {
 public:
  permit_core(const char* name, std::size_t initial, bool bounded, asio::any_io_executor ex)
      : name_(name), ex_(std::move(ex)), value_(initial), bound_(initial), bounded_(bounded) {
    affinity_.bind(ex_);
  }
  permit_core(const permit_core&) = delete;
  permit_core& operator=(const permit_core&) = delete;
  ~permit_core() { abort_all(waiters_); }

  bool try_acquire() {
    const auto in = affinity_.enter(name_);
    if (value_ > 0 && waiters_.empty()) {
      --value_;
      return true;
    }
    return false;
  }

  void release(const char* over_release_message) {
    const auto in = affinity_.enter(name_);
    if (waiter_node* n = waiters_.pop_front()) {
      static_cast<wait_op*>(n)->complete(error_code{});
      return;
    }
    if (bounded_ && value_ >= bound_) throw std::logic_error(over_release_message);
    ++value_;
  }

  template <class Handler>
  void initiate(Handler&& handler, bool cancellable) {
    affinity_.bind(asio::get_associated_executor(handler, ex_));
    const auto in = affinity_.enter(name_);
    const bool ready = value_ > 0 && waiters_.empty();
    start_wait<wait_op, deliver_nothing>(std::forward<Handler>(handler), ex_, name_, waiters_,
                                         ready, cancellable);
    if (ready) --value_;
  }

  template <class CompletionToken>
  auto async_acquire(CompletionToken&& token, bool cancellable = true) {
    return asio::async_initiate<CompletionToken, void(error_code)>(
        [self = this, cancellable](auto&& handler) {
          self->initiate(std::forward<decltype(handler)>(handler), cancellable);
        },
        token);
  }

  // The uncontended path does not suspend. A waiter that was granted its permit
  // but whose coroutine was cancelled before it resumed hands the permit on and
  // throws operation_aborted, as if the cancellation had come first.
  asio::awaitable<void> acquire() {
    if constexpr (affinity::enabled) affinity_.bind(co_await asio::this_coro::executor);
    if (try_acquire()) co_return;
    auto state = co_await asio::this_coro::cancellation_state;
    const bool cancelled_before = state.cancelled() != asio::cancellation_type::none;
    co_await async_acquire(asio::use_awaitable);
    if (!cancelled_before && state.cancelled() != asio::cancellation_type::none) {
      release("");
      throw system_error(asio::error::operation_aborted);
    }
  }

  // As acquire(), but the wait ignores cancellation (condition::wait
  // re-acquires its lock even when cancelled). The caller disables
  // throw_if_cancelled around the co_await.
  asio::awaitable<void> acquire_uncancellable() {
    if constexpr (affinity::enabled) affinity_.bind(co_await asio::this_coro::executor);
    if (try_acquire()) co_return;
    co_await async_acquire(asio::use_awaitable, false);
  }

  [[nodiscard]] std::size_t value() const noexcept { return value_; }
  [[nodiscard]] std::size_t waiters() const noexcept { return waiters_.size(); }
  [[nodiscard]] std::size_t max_waiters() const noexcept { return waiters_.max_size(); }
  [[nodiscard]] bool locked() const noexcept { return value_ == 0 || !waiters_.empty(); }
  [[nodiscard]] const asio::any_io_executor& executor() const noexcept { return ex_; }
  [[nodiscard]] const char* name() const noexcept { return name_; }
  // The loop-affinity check, shared with a condition that waits with this lock.
  [[nodiscard]] affinity& checker() noexcept { return affinity_; }

 private:
  const char* name_;
  asio::any_io_executor ex_;
  waiter_list waiters_;
  std::size_t value_;
  std::size_t bound_;
  bool bounded_;
  [[no_unique_address]] affinity affinity_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_PERMIT_CORE_HPP
