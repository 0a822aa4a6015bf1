// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_KEYED_RATE_LIMITER_HPP
#define SLUICE_KEYED_RATE_LIMITER_HPP

#include <sluice/config.hpp>
#include <sluice/detail/rate_core.hpp>
#include <sluice/overloaded_error.hpp>
#include <sluice/stats.hpp>
#include <sluice/time.hpp>

#include <sluice/detail/asio.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace sluice {

namespace detail {
struct keyed_limit_access;  // sluice::by_key's way in (detail/keyed_limit.hpp)
}  // namespace detail

/// One `sluice::rate_limiter{calls, per}` per key ("5 requests per second per
/// customer"), created on first use and freed when idle.
///
/// Keys are independent: a key whose window is full never delays another.
/// Per key, everything `rate_limiter` guarantees holds (any-window quota,
/// FIFO with `n`, cancellation takes nothing, one timer per busy key, time
/// from the executor's context).
///
/// Idle keys are freed: the entry of a key is removed when its window is
/// empty (its last start was at least `per` ago) and nobody waits for it.
/// Exactly when: the entries are kept in order of the instant their window
/// empties, and each `acquire`, `try_acquire` and `keys()` call first removes
/// every entry whose instant has come and that nobody uses (an entry whose
/// last waiter leaves after that instant is removed as it leaves). So
/// `keys()` counts exactly the keys whose window is not empty or that have
/// waiters, and memory follows the number of active keys.
///
/// Throws `std::invalid_argument`: `calls == 0`, `per <= 0` at construction;
/// `n == 0` or `n > calls` at the call. Destroying it with waiters completes
/// them with `operation_aborted`. Loop-affine. As for `rate_limiter`,
/// `try_acquire` on a limiter without an executor reads the steady clock
/// until a waiting coroutine (or a `by_key` fan-out, a `keyed_task_group`
/// using it) has bound the clock.
///
/// @code
/// sluice::keyed_rate_limiter<std::string> per_customer{5, std::chrono::seconds(1)};
/// co_await per_customer.acquire(customer_id);          // at most 5 starts/s for this customer
/// if (!per_customer.try_acquire(other_id)) reject();    // drop instead of waiting
/// @endcode
template <class Key, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class keyed_rate_limiter {
 public:
  /// At most `calls` starts in any window of `per`, per key (`per`: any
  /// `std::chrono::duration`, saturated instead of overflowing).
  template <class Rep, class Period>
  keyed_rate_limiter(std::size_t calls, std::chrono::duration<Rep, Period> per)
      : keyed_rate_limiter(asio::any_io_executor{}, calls, detail::saturate(per), 0) {}

  /// As above, with an executor whose context's clock is used from the start.
  template <class Executor, class Rep, class Period>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      keyed_rate_limiter(const Executor& ex, std::size_t calls,
                         std::chrono::duration<Rep, Period> per)
      : keyed_rate_limiter(asio::any_io_executor(ex), calls, detail::saturate(per), 0) {}

  /// As above, each key shedding load past `shed` (as `rate_limiter`'s
  /// constructor with `shed_options`, per key; no bound on all keys
  /// together). `ex` may be empty.
  template <class Executor, class Rep, class Period>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      keyed_rate_limiter(const Executor& ex, std::size_t calls,
                         std::chrono::duration<Rep, Period> per, const shed_options& shed)
      : keyed_rate_limiter(asio::any_io_executor(ex), calls, detail::saturate(per), 0) {
    detail::wait_bound::check(shed, name);
    shed_ = shed;
  }

  keyed_rate_limiter(const keyed_rate_limiter&) = delete;
  keyed_rate_limiter& operator=(const keyed_rate_limiter&) = delete;
  ~keyed_rate_limiter() { *alive_ = false; }

  /// Waits until `n` more starts for `key` fit in its window. Throws
  /// `system_error(operation_aborted)` when cancelled (nothing taken),
  /// `std::invalid_argument` at the call for a bad `n`. `key` is copied.
  [[nodiscard]] asio::awaitable<void> acquire(Key key, std::size_t n = 1) {
    window_.check(n, name);
    return acquire_impl(std::move(key), n);
  }

  /// Takes `n` starts for `key` if they fit now and nobody waits for the key;
  /// never suspends.
  [[nodiscard]] bool try_acquire(const Key& key, std::size_t n = 1) {
    window_.check(n, name);
    return try_take(key, n).has_value();
  }

  /// Operations waiting for `key` now.
  [[nodiscard]] std::size_t waiters(const Key& key) const {
    auto it = entries_.find(key);
    return it == entries_.end() ? 0 : it->second.core.waiters();
  }

  /// Keys whose window is not empty or that have waiters (idle ones are freed
  /// first, see the class comment).
  [[nodiscard]] std::size_t keys() {
    if (clock_.bound()) sweep(clock_.now());
    return entries_.size();
  }

  /// What every key together has done and is doing (see `sluice::stats`):
  /// requests granted, `throttled` (requests that had to wait for their key's
  /// window, and `try_acquire` refusals), cancelled waits, the wait of every
  /// grant; `waiting` and `in_use` (starts in the windows now) summed over the
  /// keys in memory; `limit` is `calls` per key. No hold time. O(buckets +
  /// keys); allocates nothing.
  [[nodiscard]] sluice::stats stats() const {
    std::size_t waiting = 0, in_use = 0;
    for (const auto& [k, e] : entries_) {
      waiting += e.core.waiters();
      in_use += e.core.in_use();
    }
    return stats_.read(waiting, in_use, window_.calls());
  }

  /// One key now, on request: `waiting`, `in_use` (starts in its window) and
  /// `limit` of `key`; the counters and durations are kept for all keys
  /// together (`stats()`), since an idle key's entry is freed. O(1) plus the
  /// key's expired starts.
  [[nodiscard]] sluice::stats stats(const Key& key) const {
    sluice::stats s;
    s.limit = window_.calls();
    if (auto it = entries_.find(key); it != entries_.end()) {
      s.waiting = it->second.core.waiters();
      s.in_use = it->second.core.in_use();
    }
    return s;
  }

 private:
  friend struct detail::keyed_limit_access;
  static constexpr const char* name = "sluice::keyed_rate_limiter";
  using core_type = detail::rate_core<detail::sliding_window>;

  // One key. Invariants: users counts acquire() calls in progress for the key
  // (an entry with users is never freed); linked entries are in expiry order.
  struct entry {
    explicit entry(const keyed_rate_limiter& owner)
        : core(name, detail::sliding_window(owner.window_.calls(), owner.window_.per(), name),
               owner.ex_, owner.shed_) {}
    core_type core;
    std::size_t users = 0;
    const Key* key = nullptr;
    entry* prev = nullptr;
    entry* next = nullptr;
    bool linked = false;
    clock::time_point expires{};
  };

  keyed_rate_limiter(asio::any_io_executor ex, std::size_t calls, clock::duration per, int)
      : ex_(std::move(ex)), window_(calls, per, name) {
    clock_.bind(ex_, name);
  }

  // For by_key: one start of `key` as acquire(key) takes it, returning the
  // grant's key for give_back_start.
  asio::awaitable<clock::time_point> acquire_start(Key key) {
    return acquire_impl<true>(std::move(key), 1);
  }
  // try_acquire(key, n), returning the grant's key if it took n: the instant
  // the window recorded (on the steady clock, not a later reading).
  std::optional<clock::time_point> try_take(const Key& key, std::size_t n) {
    clock_.bind_if_unbound();
    const auto now = clock_.now();
    sweep(now);
    entry& e = find_or_add(key);
    const auto at = e.core.try_acquire_granted(n);
    settle(e, now);
    return at;
  }
  // For by_key: binds the clock to the fan-out's executor before its first
  // try_start, as a waiter would (a limiter built without an executor would
  // otherwise take the steady clock there). Throws logic_error as a wait does.
  void bind_clock(const asio::any_io_executor& ex) { clock_.bind(ex, name); }
  // For by_key: try_acquire(key), returning the grant's key if it took one.
  std::optional<clock::time_point> try_start(const Key& key) { return try_take(key, 1); }
  // For by_key: forgets the start that acquire_start returned `at` for (its
  // task never started). Nothing if the start has left the window.
  void give_back_start(const Key& key, clock::time_point at) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return;
    it->second.core.ungrant();
    it->second.core.give_back(1, at);
    settle(it->second, clock_.now());
  }

  template <bool Granted = false>
  asio::awaitable<std::conditional_t<Granted, clock::time_point, void>> acquire_impl(
      Key key, std::size_t n) {
    const asio::any_io_executor ex = co_await asio::this_coro::executor;
    clock_.bind(ex, name);
    sweep(clock_.now());
    entry& e = find_or_add(key);
    ++e.users;
    const std::shared_ptr<bool> alive = alive_;
    std::exception_ptr error;
    [[maybe_unused]] clock::time_point at{};
    try {
      if constexpr (Granted) {
        at = co_await e.core.acquire_granted(n);
      } else {
        co_await e.core.acquire(n);
      }
    } catch (...) {
      error = std::current_exception();
    }
    if (*alive) {
      --e.users;
      settle(e, clock_.now());
    }
    if (error) std::rethrow_exception(error);
    if constexpr (Granted) co_return at;
  }

  entry& find_or_add(const Key& key) {
    auto [it, added] = entries_.try_emplace(key, *this);
    if (added) {
      it->second.key = &it->first;
      it->second.core.adopt_clock(clock_);
      it->second.core.share_stats(stats_);
    }
    return it->second;
  }

  // After a use of `e`: free it if idle (returns true: `e` is gone), else
  // (re)queue it by the instant its window empties.
  bool settle(entry& e, clock::time_point now) {
    unlink(e);
    if (e.users == 0 && e.core.waiters() == 0 && e.core.policy().idle(now)) {
      entries_.erase(entries_.find(*e.key));
      return true;
    }
    if (e.users != 0) return false;  // re-queued when its last user leaves
    e.expires = e.core.policy().idle_at();
    entry* after = tail_;
    while (after != nullptr && after->expires > e.expires) after = after->prev;
    e.prev = after;
    e.next = after ? after->next : head_;
    (e.next ? e.next->prev : tail_) = &e;
    (after ? after->next : head_) = &e;
    e.linked = true;
    return false;
  }

  void unlink(entry& e) noexcept {
    if (!e.linked) return;
    (e.prev ? e.prev->next : head_) = e.next;
    (e.next ? e.next->prev : tail_) = e.prev;
    e.prev = e.next = nullptr;
    e.linked = false;
  }

  // Frees every queued entry whose window has emptied by `now`. An entry
  // queued again at or before `now` would have a window that is not empty at
  // its own idle_at() (idle() and idle_at() disagreeing on the boundary
  // instant): it is left queued rather than swept forever.
  void sweep(clock::time_point now) {
    while (head_ != nullptr && head_->expires <= now) {
      entry& e = *head_;
      if (settle(e, now)) continue;
      if (e.linked && e.expires <= now) break;
    }
  }

  asio::any_io_executor ex_;
  shed_options shed_;              // each key's bound
  detail::sliding_window window_;  // the quota (and its checks); holds no starts
  detail::clock_source clock_;
  detail::stats_sink stats_;  // every key's core counts here
  std::unordered_map<Key, entry, Hash, KeyEqual> entries_;
  entry* head_ = nullptr;
  entry* tail_ = nullptr;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace sluice

#endif  // SLUICE_KEYED_RATE_LIMITER_HPP
