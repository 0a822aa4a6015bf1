// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_STATS_RECORDER_HPP
#define SLUICE_DETAIL_STATS_RECORDER_HPP

// What the limits keep for stats(): the counters of one limit (stats_sink; for the
// thread-safe shared_semaphore, shared_stats_sink). See sluice/stats.hpp for
// what is reported.

#include <sluice/config.hpp>
#include <sluice/detail/duration_recorder.hpp>
#include <sluice/detail/virtual_clock.hpp>
#include <sluice/stats.hpp>

#include <sluice/detail/asio.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <type_traits>

namespace sluice::detail {

// On the steady clock, one permit in hold_sample_every has its hold timed
// (two clock reads, about 20 ns each, would otherwise triple the cost of an
// uncontended scoped_acquire); under a virtual clock every permit is (the
// read is free). A permit outside the sample starts its hold at `untimed`.
inline constexpr std::uint32_t hold_sample_every = 16;
inline constexpr clock::time_point untimed = clock::time_point::min();

// The executor a handler completes on, as the stats clocks take it; empty
// for one that is not an io executor (use_future's), whose waits are timed on
// the steady clock.
template <class Executor>
asio::any_io_executor stats_executor(const Executor& ex) {
  if constexpr (std::is_constructible_v<asio::any_io_executor, const Executor&>) {
    return asio::any_io_executor(ex);
  } else {
    return {};
  }
}

// Where a loop-affine limit reads the time for its stats: the virtual clock
// of the context it was last used from, or the steady clock. Unlike the rate
// limiters' clock_source it never throws: a semaphore may serve one loop after
// another, and only the durations that span the change are meaningless.
// bind() looks the service up only when the context changes or its virtual
// clock ended (a new loop at a dead one's address); the time is read through
// virtual_now, so a permit released after its loop died reads nothing freed.
class stats_clock {
 public:
  void bind(const asio::any_io_executor& ex) {
    if (!ex) return;
    auto& ctx = asio::query(ex, asio::execution::context_as<asio::execution_context&>);
    if (&ctx == ctx_ && (vnow_ == nullptr || !vnow_->ended())) return;
    ctx_ = &ctx;
    vclock_ = find_virtual_clock(ctx);
    vnow_ = vclock_ != nullptr ? vclock_->shared_now() : nullptr;
  }
  // Bound, and not to a virtual clock that has ended.
  [[nodiscard]] bool bound() const noexcept {
    return ctx_ != nullptr && (vnow_ == nullptr || !vnow_->ended());
  }
  [[nodiscard]] bool is_virtual() const noexcept { return vclock_ != nullptr; }
  // The clock just bound (valid until its context ends).
  [[nodiscard]] virtual_clock_service* virtual_clock() const noexcept { return vclock_; }
  [[nodiscard]] clock::time_point now() const noexcept {
    return vnow_ != nullptr ? vnow_->now() : clock::now();
  }

 private:
  asio::execution_context* ctx_ = nullptr;   // a cache key, never dereferenced
  virtual_clock_service* vclock_ = nullptr;  // dereferenced by no one once vnow_ ended
  std::shared_ptr<const virtual_now> vnow_;
};

// A grant to a coroutine that may still be cancelled before it resumes:
// the granting side fills this in the waiter's frame instead of counting, and
// the coroutine settles it when it resumes, as a grant (acquired, its wait)
// or, cancelled in between, as a cancelled wait only: each wait counts once.
struct pending_grant {
  bool waited = false;  // it queued: `wait` is its wait time
  clock::duration wait{};
};

// The counters and timings of one loop-affine limit (or of every key of a
// keyed one). The buckets are allocated at the first timed event, once; if
// that allocation fails the durations are not recorded (the counts still
// are). Invariant: wait.count() <= acquired (a timed wait is a grant).
class stats_sink {
 public:
  std::uint64_t acquired = 0;
  std::uint64_t cancelled = 0;
  std::uint64_t throttled = 0;
  std::uint64_t shed = 0;
  stats_clock clock;

  void record_wait(clock::duration d) noexcept {
    if (timing* t = get()) t->wait.record(d);
  }
  void record_hold(clock::duration d) noexcept {
    if (timing* t = get()) t->hold.record(d);
  }
  // A permit granted now: the start of its hold, or `untimed` outside the
  // sample.
  [[nodiscard]] clock::time_point hold_start() noexcept {
    if (!clock.is_virtual() && hold_tick_++ % hold_sample_every != 0) return untimed;
    return clock.now();
  }
  // The permit that began at `since` (hold_start()) is released now.
  void end_hold(clock::time_point since) noexcept {
    if (since != untimed) record_hold(clock.now() - since);
  }
  // A grant that did not wait was given back untouched (acquire_all took it
  // and another budget was not free): it is not counted.
  void ungrant() noexcept {
    if (acquired > 0) --acquired;
  }

  [[nodiscard]] sluice::stats read(std::size_t waiting, std::size_t in_use,
                                   std::size_t limit) const noexcept {
    sluice::stats s;
    s.acquired = acquired;
    s.cancelled = cancelled;
    s.throttled = throttled;
    s.shed = shed;
    s.waiting = waiting;
    s.in_use = in_use;
    s.limit = limit;
    const std::uint64_t timed = timing_ ? timing_->wait.count() : 0;
    const std::uint64_t zeros = acquired > timed ? acquired - timed : 0;
    if (timing_) {
      s.wait = timing_->wait.read(zeros);
      s.hold = timing_->hold.read();
    } else {
      s.wait.count = zeros;  // nothing waited: every duration is 0
    }
    return s;
  }

 private:
  struct timing {
    duration_recorder<false> wait;
    duration_recorder<false> hold;
  };
  timing* get() noexcept {
    if (!timing_) timing_.reset(new (std::nothrow) timing{});
    return timing_.get();
  }
  std::unique_ptr<timing> timing_;
  std::uint32_t hold_tick_ = 0;
};

// A grant, on either sink: counted now, or (`g` not null) left in the
// waiter's pending_grant to settle when it resumes. `waited`: it queued for
// `wait`.
template <class Sink>
void count_grant(Sink& sink, pending_grant* g, bool waited, clock::duration wait) noexcept {
  if (g != nullptr) {
    *g = {waited, wait};
    return;
  }
  stats_add(sink.acquired, 1);
  if (waited) sink.record_wait(wait);
}

// The waiter of `g` resumed holding its grant: it counts now.
template <class Sink>
void settle_grant(Sink& sink, const pending_grant& g) noexcept {
  stats_add(sink.acquired, 1);
  if (g.waited) sink.record_wait(g.wait);
}

// The same for shared_semaphore, whose grants, waits and permit releases
// happen on any thread: relaxed atomic counters, the buckets allocated once
// (the first to allocate wins), and a clock bound once: from the executor it
// was built with, else from the first waiter's or permit holder's (again
// once a virtual clock's context ended: a virtual loop per batch). read() is
// a snapshot: each counter is exact, but other threads may move between them.
class shared_stats_sink {
 public:
  shared_stats_sink() = default;
  shared_stats_sink(const shared_stats_sink&) = delete;
  shared_stats_sink& operator=(const shared_stats_sink&) = delete;
  ~shared_stats_sink() { delete timing_.load(std::memory_order_acquire); }

  std::atomic<std::uint64_t> acquired{0};
  std::atomic<std::uint64_t> cancelled{0};
  std::atomic<std::uint64_t> shed{0};

  void bind(const asio::any_io_executor& ex) {
    if (!ex || bound()) return;
    auto& ctx = asio::query(ex, asio::execution::context_as<asio::execution_context&>);
    virtual_clock_service* v = find_virtual_clock(ctx);
    std::lock_guard<std::mutex> lock(mu_);
    if (bound_locked()) return;
    vnow_ = v != nullptr ? v->shared_now() : nullptr;
    mode_.store(v != nullptr ? on_virtual : on_steady, std::memory_order_release);
  }
  // Bound to the steady clock, or to a virtual clock whose context lives.
  [[nodiscard]] bool bound() const noexcept {
    const int m = mode_.load(std::memory_order_acquire);
    if (m != on_virtual) return m == on_steady;
    std::lock_guard<std::mutex> lock(mu_);
    return bound_locked();  // rebound meanwhile, perhaps
  }
  [[nodiscard]] clock::time_point now() const noexcept {
    if (mode_.load(std::memory_order_acquire) == on_virtual) {
      std::lock_guard<std::mutex> lock(mu_);
      if (vnow_ != nullptr) return vnow_->now();  // ended: the time it ended at
    }
    return clock::now();
  }

  void record_wait(clock::duration d) noexcept {
    if (timing* t = get()) t->wait.record(d);
  }
  void record_hold(clock::duration d) noexcept {
    if (timing* t = get()) t->hold.record(d);
  }
  // As stats_sink's; the sample is counted per thread (no shared counter).
  [[nodiscard]] clock::time_point hold_start() noexcept {
    if (mode_.load(std::memory_order_acquire) != on_virtual) {
      thread_local std::uint32_t tick = 0;
      if (tick++ % hold_sample_every != 0) return untimed;
    }
    return now();
  }
  void end_hold(clock::time_point since) noexcept {
    if (since != untimed) record_hold(now() - since);
  }
  void ungrant() noexcept { acquired.fetch_sub(1, std::memory_order_relaxed); }

  [[nodiscard]] sluice::stats read(std::size_t waiting, std::size_t in_use,
                                   std::size_t limit) const noexcept {
    sluice::stats s;
    const timing* t = timing_.load(std::memory_order_acquire);
    // The wait count first: a grant counts in `acquired` before its wait is
    // recorded, so zeros never go negative.
    const std::uint64_t timed = t != nullptr ? t->wait.count() : 0;
    s.acquired = acquired.load(std::memory_order_relaxed);
    s.cancelled = cancelled.load(std::memory_order_relaxed);
    s.shed = shed.load(std::memory_order_relaxed);
    s.waiting = waiting;
    s.in_use = in_use;
    s.limit = limit;
    const std::uint64_t zeros = s.acquired > timed ? s.acquired - timed : 0;
    if (t != nullptr) {
      s.wait = t->wait.read(zeros);
      s.hold = t->hold.read();
    } else {
      s.wait.count = zeros;
    }
    return s;
  }

 private:
  struct timing {
    duration_recorder<true> wait;
    duration_recorder<true> hold;
  };
  timing* get() noexcept {
    timing* t = timing_.load(std::memory_order_acquire);
    if (t != nullptr) return t;
    auto* made = new (std::nothrow) timing{};
    if (made == nullptr) return nullptr;
    if (timing_.compare_exchange_strong(t, made, std::memory_order_acq_rel)) return made;
    delete made;
    return t;
  }
  static constexpr int unbound = 0, on_steady = 1, on_virtual = 2;
  bool bound_locked() const noexcept {
    return vnow_ != nullptr ? !vnow_->ended() : mode_ == on_steady;
  }
  std::atomic<timing*> timing_{nullptr};
  std::atomic<int> mode_{unbound};           // changes only under mu_
  std::shared_ptr<const virtual_now> vnow_;  // under mu_
  mutable std::mutex mu_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_STATS_RECORDER_HPP
