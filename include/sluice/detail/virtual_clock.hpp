// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_VIRTUAL_CLOCK_HPP
#define SLUICE_DETAIL_VIRTUAL_CLOCK_HPP

#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <ratio>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace sluice::detail {

// The clock of every sluice wait on time (sluice::clock, declared public in
// <sluice/time.hpp>, is the same type). It lives here, below everything in
// detail/ that reads the time, so detail/ never includes upward.
using clock = std::chrono::steady_clock;

// t + d, clamped to the clock's range instead of overflowing: a duration of
// clock::duration::max() means "forever", not "at once".
constexpr clock::time_point add_saturating(clock::time_point t, clock::duration d) noexcept {
  if (d > clock::duration::zero() && t > clock::time_point::max() - d)
    return clock::time_point::max();
  if (d < clock::duration::zero() && t < clock::time_point::min() - d)
    return clock::time_point::min();
  return t + d;
}

// `d` as a clock::duration, clamped to its range instead of overflowing:
// std::chrono::hours::max() (or 1000 years) means "forever"
// (clock::duration::max()), never a negative or wrapped number. Every public
// entry point that takes a duration converts it here. A floating-point NaN
// counts as forever too.
template <class Rep, class Period>
constexpr clock::duration saturate(std::chrono::duration<Rep, Period> d) noexcept {
  using target = clock::duration;
  if constexpr (std::is_floating_point_v<Rep>) {
    const long double x = std::chrono::duration<long double, target::period>(d).count();
    if (!(x < static_cast<long double>(target::max().count()))) return target::max();
    if (x <= static_cast<long double>(target::min().count())) return target::min();
    return std::chrono::duration_cast<target>(d);
  } else if constexpr (std::ratio_less_equal_v<Period, target::period>) {
    return std::chrono::duration_cast<target>(d);  // as fine or finer: divides, cannot overflow
  } else {
    // Coarser: compared in units of Period, where the bounds cannot overflow.
    using wide = std::chrono::duration<std::common_type_t<Rep, target::rep>, Period>;
    constexpr wide hi = std::chrono::duration_cast<wide>(target::max());
    if (wide(d) >= hi) return target::max();
    if constexpr (std::is_signed_v<typename wide::rep>) {
      constexpr wide lo = std::chrono::duration_cast<wide>(target::min());
      if (wide(d) <= lo) return target::min();
    }
    return std::chrono::duration_cast<target>(d);
  }
}

// A clock::duration that takes any std::chrono::duration and saturates it
// (saturate): the type of the duration fields of option structs, where a
// template parameter cannot serve, so that `.max = std::chrono::hours::max()`
// means forever instead of overflowing before sluice sees it. Derived from
// clock::duration: every duration operation applies to it as it is.
struct saturating_duration : clock::duration {
  constexpr saturating_duration() noexcept : clock::duration(clock::duration::zero()) {}
  template <class Rep, class Period>
  constexpr saturating_duration(std::chrono::duration<Rep, Period> d) noexcept  // implicit
      : clock::duration(saturate(d)) {}
};

// A pending virtual timer. It lives inside its operation; `fire` completes
// (invoke = true) or destroys (invoke = false) the operation.
struct virtual_timer_node {
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  clock::time_point deadline{};
  std::uint64_t seq = 0;
  std::size_t heap_index = npos;
  void (*fire)(virtual_timer_node*, bool invoke, error_code) = nullptr;
};

// The time of one virtual clock, in a block of its own shared with readers
// that may outlive the context (a limit serving loop after loop): once the
// context is destroyed they read the time it ended at and ended(), never the
// freed service. Relaxed atomics: a limit shared between threads reads it
// from any of them.
class virtual_now {
 public:
  [[nodiscard]] clock::time_point now() const noexcept {
    return value_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] bool ended() const noexcept { return ended_.load(std::memory_order_acquire); }

 private:
  friend class virtual_clock_service;
  std::atomic<clock::time_point> value_{};
  std::atomic<bool> ended_{false};
};

// Virtual time for one execution context. Installed by
// sluice::testing::virtual_loop; every sluice wait on time asks the context for
// this service and, if it is there, uses it instead of the steady clock.
// Invariants: `heap_` is a binary min-heap on (deadline, seq); each node's
// heap_index is its position; the time (`now_`) never decreases.
class virtual_clock_service final : public asio::execution_context::service {
 public:
  using key_type = virtual_clock_service;
  inline static asio::execution_context::id id;

  SLUICE_DECL explicit virtual_clock_service(asio::execution_context& ctx);
  SLUICE_DECL ~virtual_clock_service() override;

  clock::time_point now() const noexcept { return now_->now(); }
  // The clock's time for a reader that may outlive the context (virtual_now).
  [[nodiscard]] std::shared_ptr<const virtual_now> shared_now() const noexcept { return now_; }
  bool empty() const noexcept { return heap_.empty(); }
  std::size_t pending() const noexcept { return heap_.size(); }
  clock::time_point next_deadline() const noexcept { return heap_.front()->deadline; }
  // True if a pending timer can ever fire: one whose deadline is before the
  // end of time. A deadline of time_point::max() (a saturated "forever")
  // waits for its cancellation only, so the loop that finds nothing else to
  // run reports a deadlock instead of jumping to the end of time.
  bool has_due() const noexcept {
    return !heap_.empty() && heap_.front()->deadline != clock::time_point::max();
  }

  SLUICE_DECL void schedule(virtual_timer_node* n);

  // Removes `n` if it is pending; O(log n).
  SLUICE_DECL bool cancel(virtual_timer_node* n) noexcept;

  // Jumps to `t` (never backwards) and fires every timer due by then, in
  // deadline order (FIFO among equal deadlines), never one at the end of time
  // (see has_due). Fired timers post their handlers; nothing runs inline.
  SLUICE_DECL void advance_to(clock::time_point t);

 private:
  // The context is going away: destroy pending operations without running them.
  SLUICE_DECL void shutdown() override;

  static bool before(const virtual_timer_node* a, const virtual_timer_node* b) noexcept {
    return a->deadline < b->deadline || (a->deadline == b->deadline && a->seq < b->seq);
  }
  SLUICE_DECL void swap_nodes(std::size_t i, std::size_t j) noexcept;
  SLUICE_DECL void sift_up(std::size_t i) noexcept;
  SLUICE_DECL void sift_down(std::size_t i) noexcept;

  std::shared_ptr<virtual_now> now_;  // never null
  std::uint64_t next_seq_ = 0;
  std::vector<virtual_timer_node*> heap_;
};

// The virtual clock of `ctx`, or null when it runs on the steady clock.
inline virtual_clock_service* find_virtual_clock(asio::execution_context& ctx) {
  return asio::has_service<virtual_clock_service>(ctx)
             ? &asio::use_service<virtual_clock_service>(ctx)
             : nullptr;
}

template <class Executor>
virtual_clock_service* find_virtual_clock(const Executor& ex) {
  return find_virtual_clock(asio::query(ex, asio::execution::context_as<asio::execution_context&>));
}

}  // namespace sluice::detail

#if SLUICE_HEADER_DEFS
#include <sluice/impl/virtual_clock.ipp>
#endif

#endif  // SLUICE_DETAIL_VIRTUAL_CLOCK_HPP
