// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_KEYED_SEMAPHORE_HPP
#define SLUICE_KEYED_SEMAPHORE_HPP

#include <sluice/config.hpp>
#include <sluice/detail/affinity.hpp>
#include <sluice/detail/permit_core.hpp>
#include <sluice/detail/stats_recorder.hpp>
#include <sluice/overloaded_error.hpp>
#include <sluice/stats.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <functional>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace sluice {

namespace detail {
struct budget_access;  // sluice::acquire_all's way in (detail/all_budgets.hpp)
}  // namespace detail

/// At most `per_key` holders per key at once: one `semaphore` per key, made
/// when a key is first used and freed the moment nobody holds or waits for it
/// (pynenc's keyed concurrency, "one job per account at a time", and its
/// "N per key").
///
/// Each key behaves exactly as a `semaphore{per_key}`: FIFO hand-off, no
/// barging (`try_acquire(key)` fails while anyone waits for that key), atomic
/// cancellation. Keys are independent: a busy key never delays another one.
/// Memory is proportional to the keys held or waited for *now* (`keys()`), not
/// to the keys ever seen: a million distinct keys used one after another leave
/// `keys() == 0` and memory flat. (The hash table keeps the bucket array of its
/// largest population, as `std::unordered_map` does, and the memory of one
/// idle entry for reuse, so keys that come and go one at a time allocate
/// nothing.)
///
/// What resumes where: an uncontended `acquire(key)` does not suspend. A waiter
/// is never resumed inside `release(key)`: its completion is posted to the
/// handler's associated executor (a coroutine's own); a handler without one (a
/// bare lambda) runs on the keyed semaphore's executor, and giving one to a
/// keyed semaphore constructed without an executor throws
/// `std::invalid_argument` (nothing is kept for the key).
///
/// Per-Operation Cancellation: `async_acquire` supports terminal, partial and
/// total cancellation. A waiter is either removed (completes with
/// `asio::error::operation_aborted`, holds nothing) or was granted (completes
/// successfully and holds the permit). `acquire` / `scoped_acquire` hand a
/// permit granted to a coroutine cancelled before it resumed on to the key's
/// next waiter and throw `operation_aborted`, as `semaphore` does. A coroutine
/// cancelled before it called is refused at once, busy key or free, and
/// leaves no entry behind (as `semaphore`).
///
/// Throws: `per_key == 0` is `std::invalid_argument`; `release(key)` of a key
/// not held is `std::logic_error`. Destroying a keyed semaphore that still has
/// waiters completes them with `operation_aborted`; permits must not outlive
/// it. Loop-affine, not thread-safe; debug builds abort on use from a thread
/// that is not running its loop (see `semaphore` for exactly what is checked).
///
/// @code
/// sluice::keyed_semaphore<std::string> per_account{1};   // one call per account at once
/// auto job = [&](std::string account, std::string op) -> asio::awaitable<void> {
///   auto permit = co_await per_account.scoped_acquire(account);   // waits for the account
///   co_await provider.call(account, op);
/// };
/// if (auto p = per_account.try_acquire("acme")) { ... } else { /* drop: acme is busy */ }
/// @endcode
template <class Key, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class keyed_semaphore {
  using map_type = std::unordered_map<Key, detail::permit_core, Hash, KeyEqual>;
  using node_type = typename map_type::value_type;

 public:
  /// Move-only ownership of one permit of one key: releases it on destruction.
  class permit {
   public:
    /// An empty permit that owns nothing.
    permit() noexcept = default;
    /// Takes over `other`'s ownership; `other` is left empty.
    permit(permit&& other) noexcept
        : sem_(std::exchange(other.sem_, nullptr)),
          node_(std::exchange(other.node_, nullptr)),
          since_(other.since_) {}
    /// Releases what this owns, then takes over `other`'s ownership.
    permit& operator=(permit&& other) noexcept {
      if (this != &other) {
        reset();
        sem_ = std::exchange(other.sem_, nullptr);
        node_ = std::exchange(other.node_, nullptr);
        since_ = other.since_;
      }
      return *this;
    }
    ~permit() { reset(); }

    /// True while it owns a permit.
    explicit operator bool() const noexcept { return sem_ != nullptr; }

    /// The key it holds a permit of. Precondition: it owns a permit.
    [[nodiscard]] const Key& key() const noexcept { return node_->first; }

    /// Releases the permit now (no-op when empty).
    void reset() noexcept {
      if (auto* s = std::exchange(sem_, nullptr)) {
        s->stats_.end_hold(since_);
        s->release_node(std::exchange(node_, nullptr));
      }
    }

   private:
    friend class keyed_semaphore;
    friend struct detail::budget_access;
    permit(keyed_semaphore& s, node_type* n, detail::clock::time_point since) noexcept
        : sem_(&s), node_(n), since_(since) {}
    keyed_semaphore* sem_ = nullptr;
    node_type* node_ = nullptr;
    detail::clock::time_point since_{};
  };

  /// A keyed semaphore allowing `per_key` holders per key, without an
  /// executor. Throws `std::invalid_argument` if `per_key == 0`.
  explicit keyed_semaphore(std::size_t per_key, Hash hash = Hash{}, KeyEqual eq = KeyEqual{})
      : keyed_semaphore(asio::any_io_executor{}, per_key, std::move(hash), std::move(eq), 0) {}

  /// As above, with an executor for handlers that have none of their own.
  template <class Executor>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      keyed_semaphore(const Executor& ex, std::size_t per_key, Hash hash = Hash{},
                      KeyEqual eq = KeyEqual{})
      : keyed_semaphore(asio::any_io_executor(ex), per_key, std::move(hash), std::move(eq), 0) {}

  /// As above, each key shedding load past `shed` (as `semaphore`'s
  /// constructor with `shed_options`, per key): a caller that would wait
  /// behind `shed.max_waiting` others of its key gets
  /// `sluice::overloaded_error` at once, and a wait for a key that reaches
  /// `shed.max_wait` leaves with it; counted in `stats().shed`. Keys are
  /// bounded one by one; there is no bound on the waiters of all keys
  /// together. `ex` may be empty.
  template <class Executor>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      keyed_semaphore(const Executor& ex, std::size_t per_key, const shed_options& shed,
                      Hash hash = Hash{}, KeyEqual eq = KeyEqual{})
      : keyed_semaphore(asio::any_io_executor(ex), per_key, std::move(hash), std::move(eq), 0) {
    detail::wait_bound::check(shed, name);
    shed_ = shed;
  }

  keyed_semaphore(const keyed_semaphore&) = delete;
  keyed_semaphore& operator=(const keyed_semaphore&) = delete;

  /// Waits for a permit of `key`. Completion signature `void(error_code)`;
  /// `asio::error::operation_aborted` if cancelled or if the keyed semaphore is
  /// destroyed first. Completes through a post even when a permit is free.
  /// The key is looked up when the operation is initiated.
  template <asio::completion_token_for<void(error_code)> CompletionToken>
  auto async_acquire(Key key, CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(error_code)>(
        [self = this](auto&& handler, Key k) {
          self->initiate(std::forward<decltype(handler)>(handler), k);
        },
        token, std::move(key));
  }

  /// Waits for a permit of `key`; does not suspend when one is free and nobody
  /// waits for it. Throws `system_error(operation_aborted)` when cancelled
  /// (holding nothing). Pair it with `release(key)`.
  [[nodiscard]] asio::awaitable<void> acquire(Key key) {
    detail::refuse_if_cancelled(co_await asio::this_coro::cancellation_state, name);
    node_type* n = node_for(key);
    if (!n->second.try_acquire()) co_await wait(n);
  }

  /// As `acquire(key)`, returning a `permit` that releases on destruction.
  [[nodiscard]] asio::awaitable<permit> scoped_acquire(Key key) {
    detail::refuse_if_cancelled(co_await asio::this_coro::cancellation_state, name);
    node_type* n = node_for(key);
    if (!n->second.try_acquire()) co_await wait(n);
    if (!stats_.clock.bound()) stats_.clock.bind(co_await asio::this_coro::executor);
    co_return permit(*this, n, stats_.hold_start());
  }

  /// Takes a permit of `key` if one is free and nobody waits for it (drop
  /// mode: an empty optional means the key is busy); never suspends.
  [[nodiscard]] std::optional<permit> try_acquire(const Key& key) {
    node_type* n = node_for(key);  // a new key always has a free permit
    if (!n->second.try_acquire()) return std::nullopt;
    return permit(*this, n, stats_.hold_start());
  }

  /// Returns a permit of `key`: to its oldest waiter if any (resumed through a
  /// post), otherwise to the pool, freeing the key's entry when nobody holds
  /// or waits for it any more. Throws `std::logic_error` if `key` is not held.
  void release(const Key& key) {
    affinity_.check(name);
    auto it = map_.find(key);
    if (it == map_.end()) {
      throw std::logic_error(
          "sluice::keyed_semaphore::release: the key is not held (released more often than "
          "acquired)");
    }
    release_at(it);
  }

  /// Free permits of `key` now (`per_key()` for a key nobody holds).
  [[nodiscard]] std::size_t value(const Key& key) const {
    auto it = map_.find(key);
    return it == map_.end() ? per_key_ : it->second.value();
  }
  /// Operations waiting for a permit of `key` now.
  [[nodiscard]] std::size_t waiters(const Key& key) const {
    auto it = map_.find(key);
    return it == map_.end() ? 0 : it->second.waiters();
  }
  /// Keys held or waited for now (the entries in memory).
  [[nodiscard]] std::size_t keys() const noexcept { return map_.size(); }
  /// The most holders one key may have at once.
  [[nodiscard]] std::size_t per_key() const noexcept { return per_key_; }

  /// What every key together has done and is doing (see `sluice::stats`):
  /// grants, cancelled waits, the wait of every grant and the hold of every
  /// `permit` of any key; `waiting` and `in_use` summed over the keys held or
  /// waited for now; `limit` is `per_key()`. O(buckets + keys()); allocates
  /// nothing.
  [[nodiscard]] sluice::stats stats() const noexcept {
    std::size_t waiting = 0, in_use = 0;
    for (const auto& [k, core] : map_) {
      waiting += core.waiters();
      in_use += core.in_use();
    }
    return stats_.read(waiting, in_use, per_key_);
  }

  /// One key now, on request: `waiting`, `in_use` and `limit` (`per_key()`)
  /// of `key`; the counters and durations are kept for all keys together
  /// (`stats()`), since an idle key's entry is freed. O(1).
  [[nodiscard]] sluice::stats stats(const Key& key) const {
    sluice::stats s;
    s.limit = per_key_;
    if (auto it = map_.find(key); it != map_.end()) {
      s.waiting = it->second.waiters();
      s.in_use = it->second.in_use();
    }
    return s;
  }

 private:
  friend struct detail::budget_access;
  static constexpr const char* name = "sluice::keyed_semaphore";

  keyed_semaphore(asio::any_io_executor ex, std::size_t per_key, Hash hash, KeyEqual eq, int)
      : ex_(std::move(ex)), per_key_(per_key), map_(0, std::move(hash), std::move(eq)) {
    if (per_key_ == 0)
      throw std::invalid_argument("sluice::keyed_semaphore: per_key must be at least 1");
    affinity_.bind(ex_);
    stats_.clock.bind(ex_);
  }

  // The entry of `key`, made (with per_key_ free permits) if it has none.
  // Node addresses are stable: an entry stays where it is until it is erased.
  node_type* node_for(const Key& key) {
    affinity_.check(name);
    return &*entry(key).first;
  }

  // The entry of `key` and whether it was made now: from the spare node when
  // there is one (an idle entry is in exactly a new entry's state: per_key_
  // free permits, no waiter), else allocated.
  std::pair<typename map_type::iterator, bool> entry(const Key& key) {
    if constexpr (std::is_copy_assignable_v<Key>) {
      if (!spare_.empty()) {
        if (auto it = map_.find(key); it != map_.end()) return {it, false};
        spare_.key() = key;
        return {map_.insert(std::move(spare_)).position, true};
      }
    }
    auto made = map_.try_emplace(key, name, per_key_, true, ex_, shed_);
    if (made.second) made.first->second.share_stats(stats_);
    return made;
  }

  // Waits on n's key; a permit granted to a coroutine cancelled before it
  // resumed is released through the map, so an idle entry is still freed.
  asio::awaitable<void> wait(node_type* n) {
    return n->second.acquire([this, n] { release_node(n); });
  }

  template <class Handler>
  void initiate(Handler&& handler, const Key& key) {
    affinity_.bind(asio::get_associated_executor(handler, ex_));
    affinity_.check(name);
    auto [it, made] = entry(key);
    try {
      // A refused caller (cancelled before it called) took nothing: a new
      // entry is idle and goes at once.
      if (it->second.initiate(std::forward<Handler>(handler), true) ==
              detail::wait_start::refused &&
          made)
        map_.erase(it);
    } catch (...) {
      if (made) map_.erase(it);  // rejected handler: keep nothing for the key
      throw;
    }
  }

  void release_node(node_type* n) { release_at(map_.find(n->first)); }

  // Invariant kept: an entry exists only while someone holds or waits for its
  // key. A waiter implies no free permit (permit_core's invariant), so the
  // entry can become idle only here, never when a waiter is cancelled.
  void release_at(typename map_type::iterator it) {
    detail::permit_core& core = it->second;
    core.release("sluice::keyed_semaphore::release: the key is not held");
    if (core.value() == per_key_ && core.waiters() == 0) {
      if (std::is_copy_assignable_v<Key> && spare_.empty()) {
        spare_ = map_.extract(it);
      } else {
        map_.erase(it);
      }
    }
  }

  asio::any_io_executor ex_;
  shed_options shed_;  // each key's bound
  std::size_t per_key_;
  detail::stats_sink stats_;  // every key's core counts here
  map_type map_;
  // One idle entry kept for the next new key, so keys that come and go one at
  // a time allocate nothing. Not counted by keys().
  typename map_type::node_type spare_;
  [[no_unique_address]] detail::affinity affinity_;
};

}  // namespace sluice

#endif  // SLUICE_KEYED_SEMAPHORE_HPP
