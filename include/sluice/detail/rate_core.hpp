// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_RATE_CORE_HPP
#define SLUICE_DETAIL_RATE_CORE_HPP

#include <sluice/config.hpp>
#include <sluice/detail/affinity.hpp>
#include <sluice/detail/stats_recorder.hpp>
#include <sluice/detail/virtual_clock.hpp>
#include <sluice/detail/waiter_list.hpp>
#include <sluice/stats.hpp>
#include <sluice/time.hpp>

#include <sluice/detail/asio.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>

namespace sluice::detail {

// Where a time-based limiter reads the time: the virtual clock of an execution
// context, or the steady clock. Bound once, from the limiter's executor or
// from the first waiter's; a later use on the other kind of clock is a
// std::logic_error (the recorded times would not compare).
class clock_source {
 public:
  void bind(const asio::any_io_executor& ex, const char* who) {
    if (!ex) return;
    auto& ctx = asio::query(ex, asio::execution::context_as<asio::execution_context&>);
    if (bound_ && &ctx == ctx_) return;  // the usual case: no service lookup
    virtual_clock_service* v = find_virtual_clock(ctx);
    if (!bound_) {
      bound_ = true;
      vclock_ = v;
    } else if (v != vclock_) {
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
  [[nodiscard]] virtual_clock_service* virtual_clock() const noexcept { return vclock_; }
  [[nodiscard]] clock::time_point now() const { return vclock_ ? vclock_->now() : clock::now(); }

 private:
  bool bound_ = false;
  virtual_clock_service* vclock_ = nullptr;
  asio::execution_context* ctx_ = nullptr;  // the context last seen (a cache)
};

// The single timer of one limiter: calls fn(context) at the armed deadline. On
// a virtual clock it is a node in the clock's heap (seen by the autojump); on
// the steady clock an asio::steady_timer, created at the first arm().
// Invariants: armed_ is true while a firing is pending for at_; a stale
// steady-timer completion (generation mismatch, or the owner gone) does
// nothing.
class rate_timer {
 public:
  rate_timer(void (*fn)(void*), void* context) noexcept : fn_(fn), context_(context) {
    node_.owner = this;
    node_.fire = &fire_virtual;
  }
  rate_timer(const rate_timer&) = delete;
  rate_timer& operator=(const rate_timer&) = delete;
  ~rate_timer() {
    disarm();
    if (real_) real_->owner = nullptr;
  }

  void arm(virtual_clock_service* v, const asio::any_io_executor& ex, clock::time_point t) {
    if (armed_ && at_ == t) return;
    disarm();
    vclock_ = v;
    if (v != nullptr) {
      node_.deadline = t;
      v->schedule(&node_);
    } else {
      if (!real_) real_ = std::make_shared<real_state>(this, ex);
      real_->timer.expires_at(t);
      real_->timer.async_wait([s = real_, g = ++real_->generation](const error_code&) {
        if (s->owner == nullptr || s->generation != g) return;
        s->owner->armed_ = false;
        s->owner->fn_(s->owner->context_);
      });
    }
    armed_ = true;
    at_ = t;
  }

  void disarm() noexcept {
    if (!armed_) return;
    armed_ = false;
    if (vclock_ != nullptr) {
      // Not in the heap any more if the clock was shut down (the loop died).
      if (node_.heap_index != virtual_timer_node::npos) vclock_->cancel(&node_);
    } else if (real_) {
      ++real_->generation;
      real_->timer.cancel();
    }
  }

 private:
  struct node : virtual_timer_node {
    rate_timer* owner = nullptr;
  };
  struct real_state {
    real_state(rate_timer* o, const asio::any_io_executor& ex) : owner(o), timer(ex) {}
    rate_timer* owner;
    asio::steady_timer timer;
    std::uint64_t generation = 0;
  };

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

// The window of a sliding-window limiter: at most `calls` starts in any
// half-open window (t - per, t], the rule slow_service's quota enforces.
// Invariants: starts_ holds (time, count) in increasing time, none expired as
// of the last expire(); used_ is the sum of the counts and never exceeds
// calls_.
class sliding_window {
 public:
  sliding_window(std::size_t calls, clock::duration per, const char* who)
      : calls_(calls), per_(per) {
    if (calls == 0) throw std::invalid_argument(std::string(who) + ": calls must be at least 1");
    if (per <= clock::duration::zero())
      throw std::invalid_argument(std::string(who) + ": the window `per` must be positive");
  }

  void check(std::size_t n, const char* who) const {
    if (n == 0 || n > calls_)
      throw std::invalid_argument(std::string(who) + ": acquire(n) needs 1 <= n <= calls (" +
                                  std::to_string(calls_) + "), got " + std::to_string(n) +
                                  "; a larger n could never be granted");
  }

  // The earliest instant >= now at which n more starts fit: the k-th oldest
  // start in the window leaves it, k being the excess.
  clock::time_point ready_at(std::size_t n, clock::time_point now) {
    expire(now);
    if (used_ + n <= calls_) return now;
    std::size_t k = used_ + n - calls_;
    for (const auto& s : starts_) {
      if (s.count >= k) return s.at + per_;
      k -= s.count;
    }
    return now;  // unreachable: n <= calls_
  }

  void take(std::size_t n, clock::time_point now) {
    if (!starts_.empty() && starts_.back().at == now) {
      starts_.back().count += n;
    } else {
      starts_.push_back({now, n});
    }
    used_ += n;
  }

  // Forgets n starts recorded at `at` (a grant that never started).
  void give_back(std::size_t n, clock::time_point at) {
    for (auto it = starts_.end(); it != starts_.begin();) {
      --it;
      if (it->at < at) return;
      if (it->at == at) {
        const std::size_t k = std::min(n, it->count);
        it->count -= k;
        used_ -= k;
        if (it->count == 0) starts_.erase(it);
        return;
      }
    }
  }

  // True when the window is empty at `now` (a fresh limiter).
  bool idle(clock::time_point now) {
    expire(now);
    return starts_.empty();
  }
  // The instant the window empties if nothing else starts.
  [[nodiscard]] clock::time_point idle_at() const noexcept {
    return starts_.empty() ? clock::time_point::min() : starts_.back().at + per_;
  }

  [[nodiscard]] std::size_t calls() const noexcept { return calls_; }
  [[nodiscard]] clock::duration per() const noexcept { return per_; }

  // For stats(): the starts still in the window at `now`, and the quota.
  [[nodiscard]] std::size_t in_use(clock::time_point now) const noexcept {
    std::size_t used = used_;
    for (const auto& s : starts_) {
      if (s.at + per_ > now) break;
      used -= s.count;
    }
    return used;
  }
  [[nodiscard]] std::size_t limit() const noexcept { return calls_; }

 private:
  struct start {
    clock::time_point at;
    std::size_t count;
  };
  void expire(clock::time_point now) {
    while (!starts_.empty() && starts_.front().at + per_ <= now) {
      used_ -= starts_.front().count;
      starts_.pop_front();
    }
  }

  std::size_t calls_;
  clock::duration per_;
  std::size_t used_ = 0;
  std::deque<start> starts_;
};

// A token bucket as a GCRA: tat_ is the instant the bucket is full again; n
// tokens are free at t when tat_ - t <= (burst - n) * interval. The interval
// (1 / rate) is kept in whole nanoseconds: exact for rates that divide 1e9.
class bucket {
 public:
  bucket(double rate_per_second, std::size_t burst, const char* who) : burst_(burst) {
    if (!(rate_per_second > 0.0) || !std::isfinite(rate_per_second))
      throw std::invalid_argument(std::string(who) +
                                  ": rate_per_second must be positive and finite");
    if (burst == 0) throw std::invalid_argument(std::string(who) + ": burst must be at least 1");
    const double ns = std::round(1e9 / rate_per_second);
    if (ns < 1.0)
      throw std::invalid_argument(std::string(who) +
                                  ": rate_per_second above 1e9 (one token per nanosecond)");
    if (ns * static_cast<double>(burst) > 1e18)
      throw std::invalid_argument(std::string(who) + ": burst / rate_per_second is too long");
    interval_ = clock::duration(static_cast<clock::duration::rep>(ns));
  }

  void check(std::size_t n, const char* who) const {
    if (n == 0 || n > burst_)
      throw std::invalid_argument(std::string(who) + ": acquire(n) needs 1 <= n <= burst (" +
                                  std::to_string(burst_) + "), got " + std::to_string(n) +
                                  "; a larger n could never be granted");
  }

  clock::time_point ready_at(std::size_t n, clock::time_point now) const {
    return std::max(now, tat_ - scaled(burst_ - n));
  }
  void take(std::size_t n, clock::time_point now) { tat_ = std::max(tat_, now) + scaled(n); }
  void give_back(std::size_t n, clock::time_point) { tat_ -= scaled(n); }
  bool idle(clock::time_point now) const noexcept { return tat_ <= now; }
  [[nodiscard]] clock::time_point idle_at() const noexcept { return tat_; }

  // Tokens free at `now` (fractional while refilling).
  [[nodiscard]] double tokens(clock::time_point now) const noexcept {
    const auto debt = std::max(clock::duration::zero(), tat_ - now);
    return static_cast<double>(burst_) -
           std::chrono::duration<double>(debt) / std::chrono::duration<double>(interval_);
  }
  [[nodiscard]] std::size_t burst() const noexcept { return burst_; }
  [[nodiscard]] clock::duration interval() const noexcept { return interval_; }

  // For stats(): the tokens taken and not refilled yet at `now` (a token
  // partly refilled counts as taken), and the burst.
  [[nodiscard]] std::size_t in_use(clock::time_point now) const noexcept {
    const double taken = std::ceil(static_cast<double>(burst_) - tokens(now));
    return taken <= 0 ? 0 : static_cast<std::size_t>(taken);
  }
  [[nodiscard]] std::size_t limit() const noexcept { return burst_; }

 private:
  clock::duration scaled(std::size_t n) const noexcept {
    return interval_ * static_cast<clock::duration::rep>(n);
  }
  std::size_t burst_;
  clock::duration interval_{};
  clock::time_point tat_{};  // the epoch: full from the start
};

// One wait for n units; granted_at holds the instant it began waiting until
// it is granted, then the grant's.
struct rate_wait : wait_op {
  rate_wait(std::size_t count, clock::time_point at) noexcept : n(count), granted_at(at) {}
  std::size_t n;
  clock::time_point granted_at;
};

// Internal completions also carry the grant time, so a grant that a cancelled
// coroutine never used can be given back exactly.
struct deliver_grant_time {
  std::tuple<clock::time_point> operator()(rate_wait& w, error_code) const noexcept {
    return {w.granted_at};
  }
};

// The queue and timer shared by rate_limiter, token_bucket and the entries of
// keyed_rate_limiter; Policy decides when n units are free (sliding_window,
// bucket).
//
// Invariants: waiters are served strictly FIFO (the head is granted first, and
// nothing behind it is granted while it waits, so a large request is never
// starved and small ones never barge); the timer is armed exactly while
// someone waits, for the instant the head becomes ready; every change of the
// head (a grant, a cancellation, a give-back) runs service().
template <class Policy>
class rate_core {
 public:
  rate_core(const char* name, Policy policy, asio::any_io_executor ex)
      : name_(name), policy_(std::move(policy)), ex_(std::move(ex)), timer_(&on_event, this) {
    affinity_.bind(ex_);
    clock_.bind(ex_, name_);
    waiters_.on_cancel(&on_cancelled, this);
  }
  rate_core(const rate_core&) = delete;
  rate_core& operator=(const rate_core&) = delete;
  ~rate_core() {
    timer_.disarm();
    if (alive_) *alive_ = false;
    abort_all(waiters_);
  }

  void check(std::size_t n) const { policy_.check(n, name_); }

  bool try_acquire(std::size_t n) {
    check(n);
    const auto in = affinity_.enter(name_);
    clock_.bind_if_unbound();
    if (try_take(n, clock_.now())) return true;
    ++stats_->throttled;
    return false;
  }

  template <class Deliver, class Handler>
  void initiate(Handler&& handler, std::size_t n) {
    auto hex = asio::get_associated_executor(handler, ex_);
    affinity_.bind(hex);
    const auto in = affinity_.enter(name_);
    const asio::any_io_executor any(hex);
    clock_.bind(any, name_);
    if (!timer_ex_) timer_ex_ = ex_ ? ex_ : any;
    const auto now = clock_.now();
    const bool ready = waiters_.empty() && policy_.ready_at(n, now) <= now;
    start_wait<rate_wait, Deliver>(std::forward<Handler>(handler), ex_, name_, waiters_, ready,
                                   true, n, now);
    if (ready) {
      policy_.take(n, now);
      ++stats_->acquired;
    } else {
      ++stats_->throttled;
      if (waiters_.size() == 1) service();  // the new head: arm the timer
    }
  }

  template <class CompletionToken>
  auto async_acquire(std::size_t n, CompletionToken&& token) {
    check(n);
    return asio::async_initiate<CompletionToken, void(error_code)>(
        [self = this](auto&& handler, std::size_t count) {
          self->template initiate<deliver_nothing>(std::forward<decltype(handler)>(handler), count);
        },
        token, n);
  }

  // Waits for n units. A caller whose cancellation was already requested
  // takes nothing and throws operation_aborted; one cancelled after its grant
  // but before it resumed gives the grant back (by its grant time) and throws
  // operation_aborted. Precondition: check(n) passed.
  asio::awaitable<void> acquire(std::size_t n) {
    const auto state = co_await asio::this_coro::cancellation_state;
    if (state.cancelled() != asio::cancellation_type::none)
      throw system_error(asio::error::operation_aborted, name_);
    affinity_.check(name_);  // a check only: no scope across co_await
    clock_.bind(co_await asio::this_coro::executor, name_);
    if (try_take(n, clock_.now())) co_return;
    if (!alive_) alive_ = std::make_shared<bool>(true);
    const std::shared_ptr<bool> alive = alive_;
    auto initiation = [self = this](auto&& handler, std::size_t count) {
      self->template initiate<deliver_grant_time>(std::forward<decltype(handler)>(handler), count);
    };
    const clock::time_point granted =
        co_await asio::async_initiate<const asio::use_awaitable_t<>&,
                                      void(error_code, clock::time_point)>(
            std::move(initiation), asio::use_awaitable_t<>{}, n);
    if (state.cancelled() != asio::cancellation_type::none) {
      if (*alive) {
        ++stats_->cancelled;
        give_back(n, granted);
      }
      throw system_error(asio::error::operation_aborted, name_);
    }
  }

  void give_back(std::size_t n, clock::time_point granted_at) {
    policy_.give_back(n, granted_at);
    service();
  }

  // For keyed limiters: share an already bound clock.
  void adopt_clock(const clock_source& c) noexcept { clock_.adopt(c); }

  [[nodiscard]] std::size_t waiters() const noexcept { return waiters_.size(); }
  [[nodiscard]] std::size_t max_waiters() const noexcept { return waiters_.max_size(); }
  [[nodiscard]] Policy& policy() noexcept { return policy_; }
  [[nodiscard]] const Policy& policy() const noexcept { return policy_; }
  [[nodiscard]] clock::time_point now() const { return clock_.now(); }

  // Counts into `sink` instead of this core's own (keyed_rate_limiter: one
  // sink for every key). Before any use.
  void share_stats(stats_sink& sink) noexcept { stats_ = &sink; }
  [[nodiscard]] std::size_t in_use() const { return policy_.in_use(clock_.now()); }
  [[nodiscard]] sluice::stats stats() const {
    return stats_->read(waiters_.size(), in_use(), policy_.limit());
  }

 private:
  bool try_take(std::size_t n, clock::time_point now) {
    if (!waiters_.empty() || policy_.ready_at(n, now) > now) return false;
    policy_.take(n, now);
    ++stats_->acquired;
    return true;
  }

  // Grants every waiter that is ready now, in order, then arms the timer for
  // the new head (or disarms it when nobody waits).
  void service() {
    const auto now = clock_.now();
    while (waiter_node* front = waiters_.front()) {
      auto* w = static_cast<rate_wait*>(front);
      const auto t = policy_.ready_at(w->n, now);
      if (t > now) {
        timer_.arm(clock_.virtual_clock(), timer_ex_, t);
        return;
      }
      waiters_.pop_front();
      policy_.take(w->n, now);
      ++stats_->acquired;
      stats_->record_wait(now - w->granted_at);
      w->granted_at = now;
      w->complete(error_code{});
    }
    timer_.disarm();
  }

  static void on_event(void* self) { static_cast<rate_core*>(self)->service(); }
  static void on_cancelled(void* self) {
    auto* core = static_cast<rate_core*>(self);
    ++core->stats_->cancelled;
    core->service();
  }

  const char* name_;
  Policy policy_;
  asio::any_io_executor ex_;
  asio::any_io_executor timer_ex_;
  clock_source clock_;
  stats_sink own_stats_;
  stats_sink* stats_ = &own_stats_;
  waiter_list waiters_;
  rate_timer timer_;
  std::shared_ptr<bool> alive_;
  [[no_unique_address]] affinity affinity_;
};

// The public members shared by rate_limiter and token_bucket (documented
// there), over one rate_core.
template <class Policy>
class rate_limiter_api {
 public:
  rate_limiter_api(const rate_limiter_api&) = delete;
  rate_limiter_api& operator=(const rate_limiter_api&) = delete;

  /// Waits until `n` units are free. Completion signature `void(error_code)`;
  /// `operation_aborted` if cancelled (nothing taken) or if the limiter is
  /// destroyed first. Completes through a post even when free. Throws
  /// `std::invalid_argument` at once for `n == 0` or an `n` that could never
  /// be granted.
  template <asio::completion_token_for<void(error_code)> CompletionToken>
  auto async_acquire(std::size_t n, CompletionToken&& token) {
    return core_.async_acquire(n, std::forward<CompletionToken>(token));
  }

  /// Waits until `n` units are free; does not suspend when they are and nobody
  /// waits. Throws `system_error(operation_aborted)` when cancelled (nothing
  /// taken), `std::invalid_argument` at the call for a bad `n`.
  [[nodiscard]] asio::awaitable<void> acquire(std::size_t n = 1) {
    core_.check(n);
    return core_.acquire(n);
  }

  /// Takes `n` units if they are free now and nobody waits; never suspends.
  [[nodiscard]] bool try_acquire(std::size_t n = 1) { return core_.try_acquire(n); }

  /// Operations waiting now.
  [[nodiscard]] std::size_t waiters() const noexcept { return core_.waiters(); }
  /// The most operations that ever waited at once.
  [[nodiscard]] std::size_t max_waiters() const noexcept { return core_.max_waiters(); }

  /// What the limiter has done and is doing (see `sluice::stats`): requests
  /// granted (`acquire(n)` counts once), `throttled` (requests that had to
  /// wait, and `try_acquire` refusals), cancelled waits, waiting now, the
  /// wait of every grant (0 for those that did not wait); `in_use` is the
  /// units the window (or the bucket) holds now, `limit` the quota (`calls`,
  /// or `burst`); no hold time. On the limiter's clock; O(buckets) plus, for
  /// a window, the starts that expired since the last call. Allocates nothing.
  [[nodiscard]] sluice::stats stats() const { return core_.stats(); }

 protected:
  rate_limiter_api(const char* name, Policy policy, asio::any_io_executor ex)
      : core_(name, std::move(policy), std::move(ex)) {}
  ~rate_limiter_api() = default;

  rate_core<Policy> core_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_RATE_CORE_HPP
