// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_RATE_CORE_HPP
#define SLUICE_DETAIL_RATE_CORE_HPP

// The grant logic shared by rate_limiter, token_bucket and keyed_rate_limiter:
// a FIFO of waiters over a policy (rate_policy.hpp) and a time source
// (rate_clock.hpp).

#include <sluice/config.hpp>
#include <sluice/detail/affinity.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/rate_clock.hpp>
#include <sluice/detail/rate_policy.hpp>
#include <sluice/detail/stats_recorder.hpp>
#include <sluice/detail/virtual_clock.hpp>
#include <sluice/detail/wait_bound.hpp>
#include <sluice/detail/waiter_list.hpp>
#include <sluice/overloaded_error.hpp>
#include <sluice/stats.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>

namespace sluice::detail {

// One wait for n units; granted_at holds the instant it began waiting until
// it is granted, then the grant's key (see rate_core::give_back). ex is the
// executor the waiter resumes on: the limiter's timer, while this waiter is
// the head, runs on its context (timers belong to the wait).
// `pending`: the waiting coroutine's, when it counts the grant itself.
struct rate_wait : wait_op {
  rate_wait(std::size_t count, clock::time_point at, asio::any_io_executor e,
            pending_grant* p) noexcept
      : n(count), granted_at(at), ex(std::move(e)), pending(p) {}
  std::size_t n;
  clock::time_point granted_at;
  asio::any_io_executor ex;
  pending_grant* pending;
};

// Internal completions also carry the grant's key, so a grant that a
// cancelled coroutine never used can be given back exactly.
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
  rate_core(const char* name, Policy policy, asio::any_io_executor ex,
            const shed_options& shed = {})
      : name_(name),
        policy_(std::move(policy)),
        ex_(std::move(ex)),
        timer_(&on_event, this),
        shed_(wait_bound::make(shed, name, &on_expire, this)) {
    affinity_.bind(ex_);
    bind_clock(ex_);
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

  bool try_acquire(std::size_t n) { return try_acquire_granted(n).has_value(); }
  // As try_acquire(n), returning the grant's key for give_back if it took n.
  std::optional<clock::time_point> try_acquire_granted(std::size_t n) {
    check(n);
    const auto in = affinity_.enter(name_);
    clock_.bind_if_unbound();
    sync_clock_kind();
    if (auto key = try_take(n, clock_.now())) return key;
    ++stats_->throttled;
    return std::nullopt;
  }

  template <class Deliver, class Handler>
  void initiate(Handler&& handler, std::size_t n, pending_grant* pending = nullptr) {
    auto hex = asio::get_associated_executor(handler, ex_);
    affinity_.bind(hex);
    const auto in = affinity_.enter(name_);
    asio::any_io_executor any(hex);
    bind_clock(any);
    const auto now = clock_.now();
    const bool ready = waiters_.empty() && policy_.ready_at(n, now) <= now;
    if (!ready && shed_ && shed(n, now) && !cancel_requested(handler)) {
      shed_now<Deliver>(std::forward<Handler>(handler), now);
      return;
    }
    // Taken before the completion is posted, so that it carries the grant's key.
    const clock::time_point at = ready ? policy_.take(n, now) : now;
    wait_start started = wait_start::waiting;
    try {
      started = start_wait<rate_wait, Deliver>(std::forward<Handler>(handler), ex_, name_, waiters_,
                                               ready, true, n, at, std::move(any), pending);
    } catch (...) {
      if (ready) policy_.give_back(n, at, now);
      throw;
    }
    if (started == wait_start::refused) {  // cancelled before it called: takes nothing
      if (ready) policy_.give_back(n, at, now);
      return;
    }
    if (ready) {
      count_grant(*stats_, pending, false, {});
    } else {
      ++stats_->throttled;
      if (shed_)
        shed_->queued(waiters_.size() == 1, now, clock_.virtual_clock(),
                      static_cast<rate_wait*>(waiters_.back())->ex);
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
  asio::awaitable<void> acquire(std::size_t n) { return acquire_impl<false>(n); }
  // As acquire(n), returning the grant's key for give_back (the grant instant
  // for a sliding window; for a bucket, where its tokens end on the refill
  // timeline).
  asio::awaitable<clock::time_point> acquire_granted(std::size_t n) {
    return acquire_impl<true>(n);
  }

  // For acquire_all: true if n units could be taken now on `ex`'s clock
  // (nobody waits, the policy has room); takes nothing.
  bool ready(std::size_t n, const asio::any_io_executor& ex) {
    affinity_.bind(ex);
    const auto in = affinity_.enter(name_);
    bind_clock(ex);
    const auto now = clock_.now();
    return waiters_.empty() && policy_.ready_at(n, now) <= now;
  }
  // For acquire_all: takes n units that ready() just found free; returns the
  // grant time.
  clock::time_point take_ready(std::size_t n, const asio::any_io_executor& ex) {
    const auto in = affinity_.enter(name_);
    bind_clock(ex);
    const auto now = clock_.now();
    const clock::time_point key = policy_.take(n, now);
    ++stats_->acquired;
    return key;
  }

  // Returns the n units of a grant that never started, identified by the key
  // its grant returned (acquire_granted, take_ready): a sliding window forgets
  // the start; a bucket refunds the tokens not yet refilled.
  void give_back(std::size_t n, clock::time_point key) {
    policy_.give_back(n, key, clock_.now());
    service();
  }

  // On the steady clock, n starts granted at `at` whose call has completed
  // count in a sliding window from now (the provider counted the request
  // before it answered, so a start in its place `per` later arrives at least
  // `per` after it, however long the request travelled). A later instant only
  // delays the head: the armed timer finds that out when it fires. In virtual
  // time, and for a token bucket, nothing changes.
  void restamp(std::size_t n, clock::time_point at) noexcept {
    if constexpr (requires(Policy & p) { p.restamp(n, at, at); }) {
      if (!clock_.bound() || clock_.virtual_clock() != nullptr) return;
      try {
        policy_.restamp(n, at, clock_.now());
      } catch (...) {  // out of memory: the start left the window early
      }
    }
  }

  // For keyed limiters: share an already bound clock.
  void adopt_clock(const clock_source& c) noexcept {
    clock_.adopt(c);
    sync_clock_kind();
  }

  [[nodiscard]] std::size_t waiters() const noexcept { return waiters_.size(); }
  [[nodiscard]] std::size_t max_waiters() const noexcept { return waiters_.max_size(); }
  [[nodiscard]] Policy& policy() noexcept { return policy_; }
  [[nodiscard]] const Policy& policy() const noexcept { return policy_; }
  [[nodiscard]] clock::time_point now() const { return clock_.now(); }

  // Counts into `sink` instead of this core's own (keyed_rate_limiter: one
  // sink for every key). Before any use.
  void share_stats(stats_sink& sink) noexcept { stats_ = &sink; }
  // A grant of take_ready() given back untouched (acquire_all): uncounted.
  void ungrant() noexcept { stats_->ungrant(); }
  [[nodiscard]] std::size_t in_use() const { return policy_.in_use(clock_.now()); }
  [[nodiscard]] sluice::stats stats() const {
    return stats_->read(waiters_.size(), in_use(), policy_.limit());
  }

 private:
  template <bool Granted>
  asio::awaitable<std::conditional_t<Granted, clock::time_point, void>> acquire_impl(
      std::size_t n) {
    const auto state = co_await asio::this_coro::cancellation_state;
    refuse_if_cancelled(state, name_);
    affinity_.check(name_);  // a check only: no scope across co_await
    bind_clock(co_await asio::this_coro::executor);
    if (const auto key = try_take(n, clock_.now())) {
      if constexpr (Granted) {
        co_return *key;
      } else {
        co_return;
      }
    }
    if (!alive_) alive_ = std::make_shared<bool>(true);
    const std::shared_ptr<bool> alive = alive_;
    pending_grant grant;
    auto initiation = [self = this, &grant](auto&& handler, std::size_t count) {
      self->template initiate<deliver_grant_time>(std::forward<decltype(handler)>(handler), count,
                                                  &grant);
    };
    const clock::duration after = shed_ ? shed_->retry_after() : clock::duration{};
    clock::time_point granted{};
    try {
      granted = co_await asio::async_initiate<const asio::use_awaitable_t<>&,
                                              void(error_code, clock::time_point)>(
          std::move(initiation), asio::use_awaitable_t<>{}, n);
    } catch (const system_error& e) {
      if (e.code() == overloaded_code())
        throw_overloaded(after);  // refused or taken out: holds nothing
      throw;
    }
    if (state.cancelled() != asio::cancellation_type::none) {
      if (*alive) {
        ++stats_->cancelled;  // not a grant: the caller gets operation_aborted
        give_back(n, granted);
      }
      throw system_error(asio::error::operation_aborted, name_);
    }
    if (*alive) settle_grant(*stats_, grant);
    if constexpr (Granted) co_return granted;
  }

  void bind_clock(const asio::any_io_executor& ex) {
    clock_.bind(ex, name_);
    sync_clock_kind();
  }
  // Tells the policy which clock its times are on (a sliding window adds its
  // travel-time margin on the steady clock only).
  void sync_clock_kind() noexcept {
    if constexpr (requires(Policy & p) { p.real_time(true); })
      policy_.real_time(clock_.bound() && clock_.virtual_clock() == nullptr);
  }

  // The grant's key (see give_back) if n units were free and taken.
  std::optional<clock::time_point> try_take(std::size_t n, clock::time_point now) {
    if (!waiters_.empty() || policy_.ready_at(n, now) > now) return std::nullopt;
    const clock::time_point key = policy_.take(n, now);
    ++stats_->acquired;
    return key;
  }

  // Grants every waiter that is ready now, in order, then arms the timer for
  // the new head (or disarms it when nobody waits).
  void service() {
    const auto now = clock_.now();
    while (waiter_node* front = waiters_.front()) {
      auto* w = static_cast<rate_wait*>(front);
      const auto t = policy_.ready_at(w->n, now);
      if (t > now) {
        timer_.arm(clock_.virtual_clock(), w->ex, t);
        return;
      }
      waiters_.pop_front();
      count_grant(*stats_, w->pending, true, now - w->granted_at);
      w->granted_at = policy_.take(w->n, now);
      w->complete(error_code{});
    }
    timer_.disarm();
    if (shed_) shed_->idle();
  }

  // A waiter refused by the bound: completed at once with
  // overloaded_code(), never queued. Out of line, as permit_core's.
  template <class Deliver, class Handler>
  [[gnu::noinline]] void shed_now(Handler&& handler, clock::time_point now) {
    require_executor<std::decay_t<Handler>>(ex_, name_);
    ++stats_->shed;  // not queued, nothing taken
    if constexpr (std::is_same_v<Deliver, deliver_nothing>) {
      post_completion(std::forward<Handler>(handler), ex_, overloaded_code());
    } else {
      post_completion(std::forward<Handler>(handler), ex_, overloaded_code(), now);
    }
  }

  // True when a new waiter for n units must be shed: past max_waiting, or
  // its wait would pass max_wait even at the head of the queue (a rate
  // limiter knows when n units free up; behind others it waits longer).
  bool shed(std::size_t n, clock::time_point now) {
    if (shed_->full(waiters_.size())) return true;
    return shed_->timed() && policy_.ready_at(n, now) > shed_->deadline(now);
  }

  // The wait bound's timer: grants what is due first (a grant at the very
  // deadline wins), then the waiters whose wait reached max_wait leave.
  static void on_expire(void* self) {
    auto* core = static_cast<rate_core*>(self);
    core->service();
    if (core->waiters_.empty()) return;
    core->shed_->take_expired(
        core->waiters_, core->clock_.now(),
        [](waiter_node* n) { return static_cast<rate_wait*>(n)->granted_at; },
        [core](waiter_node* n) {
          ++core->stats_->shed;
          static_cast<wait_op*>(n)->complete(overloaded_code());
        });
    core->service();
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
  clock_source clock_;
  stats_sink own_stats_;
  stats_sink* stats_ = &own_stats_;
  waiter_list waiters_;
  rate_timer timer_;
  std::unique_ptr<wait_bound> shed_;  // null without shed_options
  std::shared_ptr<bool> alive_;
  [[no_unique_address]] affinity affinity_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_RATE_CORE_HPP
