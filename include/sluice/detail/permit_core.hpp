// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_PERMIT_CORE_HPP
#define SLUICE_DETAIL_PERMIT_CORE_HPP

#include <sluice/config.hpp>
#include <sluice/detail/affinity.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/lazy.hpp>
#include <sluice/detail/stats_recorder.hpp>
#include <sluice/detail/wait_bound.hpp>
#include <sluice/detail/waiter_list.hpp>
#include <sluice/overloaded_error.hpp>
#include <sluice/stats.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

namespace sluice::detail {

// One wait for a permit, with the instant it began (for the wait time).
// `pending`: the waiting coroutine's, when it counts the grant itself.
struct timed_wait : wait_op {
  timed_wait(clock::time_point at, pending_grant* p) noexcept : since(at), pending(p) {}
  clock::time_point since;
  pending_grant* pending;
};

// The counting core shared by semaphore, bounded_semaphore and lock (and each
// key of keyed_semaphore).
//
// Invariants: a waiter exists only while value_ == 0 (release() hands its
// permit straight to the oldest waiter instead of incrementing), so
// try_acquire() can never barge past a waiter; when bounded_, value_ <= bound_.
// Stats: every grant adds one to stats_->acquired (a grant that suspended also
// records its wait); a cancelled wait adds one to stats_->cancelled. A grant
// to acquire()'s coroutine is counted when it resumes: as a cancelled wait
// only if it was cancelled in between (it passes the permit on).
class permit_core {
 public:
  permit_core(const char* name, std::size_t initial, bool bounded, asio::any_io_executor ex)
      : name_(name), ex_(std::move(ex)), value_(initial), bound_(initial), bounded_(bounded) {
    affinity_.bind(ex_);
    waiters_.on_cancel(&on_cancel, this);
  }
  // With a shedding bound. A separate constructor: only a TU that gives a
  // limit shed_options compiles the bound's timer (wait_bound).
  permit_core(const char* name, std::size_t initial, bool bounded, asio::any_io_executor ex,
              const shed_options& shed)
      : permit_core(name, initial, bounded, std::move(ex)) {
    shed_ = wait_bound::make(shed, name, &on_expire, this);
  }
  permit_core(const permit_core&) = delete;
  permit_core& operator=(const permit_core&) = delete;
  ~permit_core() { abort_all(waiters_); }

  bool try_acquire() {
    const auto in = affinity_.enter(name_);
    if (value_ > 0 && waiters_.empty()) {
      --value_;
      ++stats_->acquired;
      return true;
    }
    return false;
  }

  void release(const char* over_release_message) {
    const auto in = affinity_.enter(name_);
    // Checked before the hand-off too (as CPython's BoundedSemaphore does):
    // with waiters value_ is 0, so this throws only for a bound of 0, where a
    // release could otherwise hand a waiter a permit that never existed.
    if (owed_ > 0) {  // the release of a condition wait() destroyed with its loop
      --owed_;
      return;
    }
    if (bounded_ && value_ >= bound_) throw std::logic_error(over_release_message);
    if (waiter_node* n = waiters_.pop_front()) {
      auto* w = static_cast<timed_wait*>(n);
      count_grant(*stats_, w->pending, true, stats_->clock.now() - w->since);
      if (shed_ && waiters_.empty()) shed_->idle();
      w->complete(error_code{});
      return;
    }
    ++value_;
  }

  // For a limit that moves (adaptive_limit): takes up to n free permits out
  // of the pool, no grant counted; returns how many. While anyone waits
  // value_ is 0, so this never takes what a waiter is owed.
  std::size_t withdraw(std::size_t n) noexcept {
    const auto in = affinity_.enter(name_);
    const std::size_t k = n < value_ ? n : value_;
    value_ -= k;
    return k;
  }

  // The opposite: n new permits (unbounded cores only), to the oldest waiters
  // first (each a grant), the rest to the pool. O(waiters granted), not O(n).
  void deposit(std::size_t n) {
    const auto in = affinity_.enter(name_);
    for (; n > 0 && !waiters_.empty(); --n) release("");
    value_ += n;
  }

  // Returns how the wait started (refused: nothing taken).
  template <class Handler>
  wait_start initiate(Handler&& handler, bool cancellable, pending_grant* pending = nullptr) {
    const auto hex = asio::get_associated_executor(handler, ex_);
    affinity_.bind(hex);
    const auto in = affinity_.enter(name_);
    const bool ready = value_ > 0 && waiters_.empty();
    clock::time_point since{};
    if (!ready) {
      stats_->clock.bind(stats_executor(hex));
      since = stats_->clock.now();
      if (shed_ && cancellable && shed_->full(waiters_.size()) && !cancel_requested(handler)) {
        shed_now(std::forward<Handler>(handler));
        return wait_start::refused;
      }
    }
    const wait_start started = start_wait<timed_wait, deliver_nothing>(
        std::forward<Handler>(handler), ex_, name_, waiters_, ready, cancellable, since, pending);
    if (started == wait_start::completed) {
      --value_;
      count_grant(*stats_, pending, false, {});
    } else if (started == wait_start::waiting && shed_) {
      shed_->queued(waiters_.size() == 1, since, stats_->clock.virtual_clock(),
                    stats_executor(hex) ? stats_executor(hex) : ex_);
    }
    return started;
  }

  template <class CompletionToken>
  auto async_acquire(CompletionToken&& token, bool cancellable = true) {
    return asio::async_initiate<CompletionToken, void(error_code)>(
        [self = this, cancellable](auto&& handler) {
          self->initiate(std::forward<decltype(handler)>(handler), cancellable);
        },
        token);
  }

  // The uncontended path does not suspend. A caller whose cancellation was
  // requested before it called is refused at once (operation_aborted), even
  // when a permit is free: it takes nothing. Past the shedding bound:
  // overloaded_error, nothing queued or taken. A waiter that was granted its
  // permit but whose coroutine was cancelled before it resumed hands the
  // permit on and throws operation_aborted, as if the cancellation had come
  // first.
  template <class = void>  // a template: compiled only in the TUs that call it (issue 32)
  asio::awaitable<void> acquire() {
    return acquire([this] { release(""); });
  }

  // As acquire(), but a granted-then-cancelled permit is handed on by calling
  // `hand_on()` (keyed_semaphore releases through its map, which may destroy
  // this core: nothing here touches `this` after hand_on()).
  template <class HandOn>
  asio::awaitable<void> acquire(HandOn hand_on) {
    return acquire_held(std::move(hand_on), no_hold{});
  }

  // As acquire(hand_on), then `held(since)` in the same frame, `since` the
  // instant the hold begins (hold_start()): a scoped_acquire is one
  // coroutine, not two (issue 32). Returns what `held` returns.
  template <class HandOn, class Held>
  asio::awaitable<std::invoke_result_t<Held&, clock::time_point>> acquire_held(HandOn hand_on,
                                                                               Held held) {
    auto state = co_await asio::this_coro::cancellation_state;
    refuse_if_cancelled(state, name_);
    if constexpr (affinity::enabled) affinity_.bind(co_await asio::this_coro::executor);
    if (!try_acquire()) {
      pending_grant grant;
      // Read before the wait: a keyed_semaphore may free this core before a
      // shed waiter resumes.
      const clock::duration after = shed_ ? shed_->retry_after() : clock::duration{};
      try {
        co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(error_code)>(
            [self = this, &grant](auto&& handler) {  // not `this`: clang 14 calls it unused
              self->initiate(std::forward<decltype(handler)>(handler), true, &grant);
            },
            asio::use_awaitable_t<>{});
      } catch (const system_error& e) {
        if (e.code() == overloaded_code()) throw_overloaded(after);  // holding nothing
        throw;
      }
      if (state.cancelled() != asio::cancellation_type::none) {
        ++stats_->cancelled;  // not a grant: the caller gets operation_aborted
        hand_on();
        throw system_error(asio::error::operation_aborted);
      }
      settle_grant(*stats_, grant);
    }
    if constexpr (std::is_same_v<Held, no_hold>) {
      co_return;
    } else if (!clock_bound()) {
      co_return held(hold_start(co_await asio::this_coro::executor));
    } else {
      co_return held(hold_start());
    }
  }

  // As acquire(), but the wait ignores cancellation (condition::wait
  // re-acquires its lock even when cancelled). The caller disables
  // throw_if_cancelled around the co_await.
  template <class Lazy = void>  // compiled only in the TUs that call it (detail/lazy.hpp)
  asio::awaitable<void> acquire_uncancellable() {
    if constexpr (affinity::enabled) affinity_.bind(co_await asio::this_coro::executor);
    if (try_acquire()) co_return;
    co_await async_acquire(lazy<Lazy>(asio::use_awaitable), false);
  }

  // A condition wait() whose frame is destroyed (its loop destroyed) between
  // giving the lock up and getting it back counts as having got it back: the
  // next release() (the guard it unwinds through) is swallowed.
  void owe_release() noexcept { ++owed_; }

  // The instant a permit's hold begins; binds the clock to `ex` first if it
  // is not bound yet (an acquisition that never waited).
  [[nodiscard]] clock::time_point hold_start(const asio::any_io_executor& ex) {
    if (!stats_->clock.bound()) stats_->clock.bind(ex);
    return stats_->hold_start();
  }
  [[nodiscard]] clock::time_point hold_start() noexcept { return stats_->hold_start(); }
  [[nodiscard]] bool clock_bound() const noexcept { return stats_->clock.bound(); }
  // A permit held since `since` (hold_start()) is being released.
  void record_hold(clock::time_point since) noexcept { stats_->end_hold(since); }
  // A permit measured on its own clock (adaptive_limit's) held for `d`.
  void record_hold_duration(clock::duration d) noexcept { stats_->record_hold(d); }
  // Counts into `sink` instead of this core's own (keyed_semaphore: one sink
  // for every key). Before any use.
  void share_stats(stats_sink& sink) noexcept { stats_ = &sink; }
  // A grant of try_acquire() given back untouched (acquire_all): uncounted.
  void ungrant() noexcept { stats_->ungrant(); }
  [[nodiscard]] sluice::stats stats() const noexcept {
    return stats_->read(waiters_.size(), in_use(), bound_);
  }
  // Permits taken and not given back (0 for a semaphore released above its
  // initial value).
  [[nodiscard]] std::size_t in_use() const noexcept {
    return bound_ > value_ ? bound_ - value_ : 0;
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
  // A waiter past max_waiting: completed at once with overloaded_code(),
  // never queued. Out of line: initiate stays as small as without a bound.
  template <class Handler>
  [[gnu::noinline]] void shed_now(Handler&& handler) {
    require_executor<std::decay_t<Handler>>(ex_, name_);
    ++stats_->shed;  // not queued, nothing taken
    post_completion(std::forward<Handler>(handler), ex_, overloaded_code());
  }

  static void on_cancel(void* self) noexcept {
    auto* core = static_cast<permit_core*>(self);
    ++core->stats_->cancelled;
    if (core->shed_ && core->waiters_.empty()) core->shed_->idle();
  }
  // The wait bound's timer: the waiters whose wait reached max_wait leave,
  // each completed with overloaded_code(), holding nothing.
  static void on_expire(void* self) {
    auto* core = static_cast<permit_core*>(self);
    core->shed_->take_expired(
        core->waiters_, core->stats_->clock.now(),
        [](waiter_node* n) { return static_cast<timed_wait*>(n)->since; },
        [core](waiter_node* n) {
          ++core->stats_->shed;
          static_cast<wait_op*>(n)->complete(overloaded_code());
        });
  }

  // acquire()'s `held`: nothing held past the grant (no clock read).
  struct no_hold {
    void operator()(clock::time_point) const noexcept {}
  };

  const char* name_;
  asio::any_io_executor ex_;
  std::unique_ptr<wait_bound> shed_;  // null without shed_options: no cost on the grant paths
  stats_sink own_stats_;
  stats_sink* stats_ = &own_stats_;
  waiter_list waiters_;
  std::size_t value_;
  std::size_t bound_;
  std::size_t owed_ = 0;  // releases to swallow (owe_release)
  bool bounded_;
  [[no_unique_address]] affinity affinity_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_PERMIT_CORE_HPP
