// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_FAIR_SEMAPHORE_HPP
#define SLUICE_FAIR_SEMAPHORE_HPP

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/fair_rotation.hpp>
#include <sluice/detail/permit_core.hpp>
#include <sluice/fair_share.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <functional>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <unordered_map>
#include <utility>

namespace sluice {

/// A semaphore of `permits` shared by keys (tenants, users, accounts) whose
/// waiters are served by weight, not by arrival: one noisy key's backlog
/// does not delay the others' calls.
///
/// - An idle semaphore grants at once, as `semaphore` does; a key with no
///   waiters takes nothing from the others. When permits run out, waiters
///   queue per key (FIFO within a key) and each freed permit goes to the next
///   key in a deficit round robin: a key in turn gets `weight` grants per
///   round (fractions carry over to its next turn while it stays backlogged),
///   so while every key waits, key k's share of the grants is
///   weight(k) / sum of weights.
/// - Why a type of its own, not an option of `semaphore`: the per-key queues
///   and the rotation would sit on `semaphore`'s hot path; here each key's
///   queue is the `semaphore` core itself (FIFO, atomic cancellation, no
///   barging: `try_acquire` fails while anyone waits), fed one permit at a
///   time. Rate limits, `adaptive_limit` and the other limit kinds get the
///   same rotation (`detail::fair_rotation`) from `sluice::fair_limit<L,
///   Key>`, a gate in front of any limit; `fair_limit<semaphore, Key>` is
///   this type's behaviour at one post more per contended grant.
/// - Weights: `set_weight(key, w)` (default 1), kept for the key until changed;
///   a change applies from the key's next turn.
/// - What resumes where: a waiter is never resumed inside `release`: its
///   completion is posted to its own executor (a handler without one runs on
///   the semaphore's, and is rejected with `std::invalid_argument` by a
///   semaphore constructed without an executor).
/// - Per-Operation Cancellation: as `semaphore` (terminal, partial, total): a
///   waiter is either removed, holding nothing, or was granted and holds the
///   permit; `acquire` hands a permit granted to a coroutine cancelled before
///   it resumed on to the next waiter, and throws `operation_aborted`. A
///   coroutine whose cancellation was requested before it called `acquire` /
///   `scoped_acquire` is refused at once (`operation_aborted`), even when a
///   permit is free.
/// - Memory: an entry per key that holds, waits or is among the last
///   `window` grants; a key's weight once set is kept.
/// - Throws: `permits == 0`, `window == 0`, a weight that is not a finite
///   number > 0: `std::invalid_argument`; `release(key)` of a key that holds
///   nothing: `std::logic_error`. Destroying it with waiters completes them
///   with `operation_aborted`; permits must not outlive it. Loop-affine (use
///   `strand_bound<fair_semaphore<K>>` from several threads).
///
/// The Redis semaphore has no fair form: one script could do it (the per-key
/// queues, the rotation and the deficits are keys of one hash slot), but a
/// grant is then O(keys visited) in a script that blocks the server, and
/// every release must run the rotation for a queue whose waiters renew
/// tickets on their own clocks; that is not built here.
///
/// @code
/// sluice::fair_semaphore<std::string> provider{8};   // 8 calls at once, shared by tenants
/// provider.set_weight("enterprise", 3);
/// auto call = [&](std::string tenant, request r) -> asio::awaitable<reply> {
///   auto permit = co_await provider.scoped_acquire(tenant);
///   co_return co_await send(r);
/// };
/// @endcode
template <class Key, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class fair_semaphore {
  struct tenant {
    explicit tenant(const asio::any_io_executor& ex) : gate(name, 0, false, ex) {}
    detail::permit_core gate;  // this key's waiters; a grant is one release into it
    double weight = 1.0;
    double deficit = 0.0;
    std::size_t in_use = 0;
    std::size_t in_window = 0;                     // grants among the last window_
    bool active = false;                           // in rotation_
    std::pair<const Key, tenant>* node = nullptr;  // its entry in map_
  };
  using map_type = std::unordered_map<Key, tenant, Hash, KeyEqual>;
  using node_type = typename map_type::value_type;

 public:
  /// Move-only ownership of one permit taken for one key: released on
  /// destruction.
  class permit {
   public:
    /// An empty permit that owns nothing.
    permit() noexcept = default;
    /// Takes over `o`'s permit.
    permit(permit&& o) noexcept
        : s_(std::exchange(o.s_, nullptr)), n_(std::exchange(o.n_, nullptr)) {}
    /// Releases this permit, then takes over `o`'s.
    permit& operator=(permit&& o) noexcept {
      if (this != &o) {
        reset();
        s_ = std::exchange(o.s_, nullptr);
        n_ = std::exchange(o.n_, nullptr);
      }
      return *this;
    }
    ~permit() { reset(); }
    /// True while it owns a permit.
    explicit operator bool() const noexcept { return s_ != nullptr; }
    /// The key it was taken for. Precondition: it owns a permit.
    [[nodiscard]] const Key& key() const noexcept { return n_->first; }
    /// Releases the permit now (no-op when empty).
    void reset() noexcept {
      if (auto* s = std::exchange(s_, nullptr)) s->release_node(std::exchange(n_, nullptr));
    }

   private:
    friend class fair_semaphore;
    permit(fair_semaphore& s, node_type* n) noexcept : s_(&s), n_(n) {}
    fair_semaphore* s_ = nullptr;
    node_type* n_ = nullptr;
  };

  /// `permits` shared by every key, without an executor.
  explicit fair_semaphore(std::size_t permits, fair_options o = {})
      : fair_semaphore(asio::any_io_executor{}, permits, o, 0) {}

  /// As above, with an executor for handlers that have none of their own.
  template <class Executor>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value)
      fair_semaphore(const Executor& ex, std::size_t permits, fair_options o = {})
      : fair_semaphore(asio::any_io_executor(ex), permits, o, 0) {}

  fair_semaphore(const fair_semaphore&) = delete;
  fair_semaphore& operator=(const fair_semaphore&) = delete;

  /// Waits for a permit for `key`: `void(error_code)`, any completion token;
  /// `operation_aborted` when cancelled or when the semaphore is destroyed
  /// first. Completes through a post even when a permit is free.
  template <asio::completion_token_for<void(error_code)> CompletionToken>
  auto async_acquire(Key key, CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(error_code)>(
        [this](auto&& handler, Key k) {
          node_type* n = node_for(k);
          const bool free = take_free(n);
          if (free) {
            n->second.gate.release("");  // the gate completes at once (posted)
          } else {
            enqueue(n);
          }
          try {
            n->second.gate.initiate(std::forward<decltype(handler)>(handler), true);
          } catch (...) {  // a rejected handler: nothing taken, nothing kept
            if (free) {
              n->second.gate.withdraw(1);
              release_node(n);
            } else {
              maybe_free(n);
            }
            throw;
          }
        },
        token, std::move(key));
  }

  /// Waits for a permit for `key`; does not suspend when one is free (then
  /// nobody waits). Throws `system_error(operation_aborted)` when cancelled,
  /// holding nothing. Pair it with `release(key)`.
  [[nodiscard]] asio::awaitable<void> acquire(Key key) {
    const auto state = co_await asio::this_coro::cancellation_state;
    detail::refuse_if_cancelled(state, name);
    node_type* n = node_for(key);
    if (take_free(n)) co_return;
    enqueue(n);
    co_await n->second.gate.acquire([this, n] { release_node(n); });
  }

  /// As `acquire(key)`, returning a `permit` that releases on destruction.
  [[nodiscard]] asio::awaitable<permit> scoped_acquire(Key key) {
    const auto state = co_await asio::this_coro::cancellation_state;
    detail::refuse_if_cancelled(state, name);
    node_type* n = node_for(key);
    if (!take_free(n)) {
      enqueue(n);
      co_await n->second.gate.acquire([this, n] { release_node(n); });
    }
    co_return permit(*this, n);
  }

  /// A permit for `key` if one is free (then nobody waits); never suspends.
  [[nodiscard]] std::optional<permit> try_acquire(const Key& key) {
    if (free_ == 0) return std::nullopt;
    node_type* n = node_for(key);
    take_free(n);
    return permit(*this, n);
  }

  /// Gives a permit of `key` back; it goes to the next key in turn (through
  /// a post), or back to the pool. Throws `std::logic_error` if `key` holds
  /// none.
  void release(const Key& key) {
    auto it = map_.find(key);
    if (it == map_.end() || it->second.in_use == 0)
      throw std::logic_error("sluice::fair_semaphore::release: the key holds no permit");
    release_node(&*it);
  }

  /// Sets `key`'s weight (default 1): while contended, its share of grants is
  /// weight / the sum of the waiting keys' weights. Throws
  /// `std::invalid_argument` unless `w` is finite and > 0.
  void set_weight(const Key& key, double w) { weights_.set(map_, key, w, name); }

  /// What `key` does now: waiting, in use, weight, and its share of the last
  /// `window` grants. O(1).
  [[nodiscard]] fair_share stats(const Key& key) const {
    fair_share s{.weight = weights_.of(key)};
    if (auto it = map_.find(key); it != map_.end()) {
      s.waiting = it->second.gate.waiters();
      s.in_use = it->second.in_use;
      s.share = window_.share(it->second);
    }
    return s;
  }

  /// Free permits now.
  [[nodiscard]] std::size_t value() const noexcept { return free_; }
  /// Operations waiting now, every key together. O(keys waiting).
  [[nodiscard]] std::size_t waiters() const noexcept {
    std::size_t w = 0;
    for (const tenant* t : rotation_.keys()) w += t->gate.waiters();
    return w;
  }
  /// Operations of `key` waiting now.
  [[nodiscard]] std::size_t waiters(const Key& key) const { return stats(key).waiting; }
  /// Keys with an entry now (holding, waiting, or among the last grants).
  [[nodiscard]] std::size_t keys() const noexcept { return map_.size(); }
  /// True when no permit is free.
  [[nodiscard]] bool locked() const noexcept { return free_ == 0; }

 private:
  static constexpr const char* name = "sluice::fair_semaphore";

  fair_semaphore(asio::any_io_executor ex, std::size_t permits, fair_options o, int)
      : ex_(std::move(ex)), free_(permits), window_(o.window) {
    if (permits == 0) throw std::invalid_argument("sluice::fair_semaphore: permits must be >= 1");
    if (o.window == 0) throw std::invalid_argument("sluice::fair_semaphore: window must be >= 1");
  }

  node_type* node_for(const Key& key) {
    auto [it, made] = map_.try_emplace(key, ex_);
    if (made) {
      it->second.node = &*it;
      it->second.weight = weights_.of(key);
    }
    return &*it;
  }

  // Invariant: free_ > 0 only while nobody waits, so a free permit is never
  // taken past a waiter.
  bool take_free(node_type* n) {
    if (free_ == 0) return false;
    grant(n);
    return true;
  }

  void enqueue(node_type* n) { rotation_.join(&n->second); }

  // One permit to `n` (from the pool or from a release), counted in the window.
  void grant(node_type* n) {
    if (free_ > 0) --free_;
    ++n->second.in_use;
    window_.record(&n->second, 1, [this](tenant* old) { maybe_free(old); });
  }

  void release_node(node_type* n) {
    --n->second.in_use;
    keep_ = n;  // hand_on() may see n's entry idle: it is freed here, after
    hand_on();
    keep_ = nullptr;
    maybe_free(n);
  }

  // Deficit round robin over the keys with waiters; nobody: back to the pool.
  void hand_on() {
    const bool served =
        rotation_.serve_next([](tenant* t) -> std::size_t { return t->gate.waiters() > 0 ? 1 : 0; },
                             [this](tenant* t, std::size_t) {
                               grant(t->node);
                               t->gate.release("");  // to the key's oldest waiter, posted
                             },
                             [this](tenant* t) { maybe_free(t); });
    if (!served) ++free_;
  }

  void maybe_free(tenant* t) {
    if (t->node != keep_ && !t->active && t->in_use == 0 && t->in_window == 0 &&
        t->gate.waiters() == 0)
      map_.erase(t->node->first);
  }
  void maybe_free(node_type* n) { maybe_free(&n->second); }

  asio::any_io_executor ex_;
  std::size_t free_;
  map_type map_;
  detail::fair_rotation<tenant> rotation_;
  detail::grant_window<tenant> window_;
  detail::fair_weights<Key, Hash, KeyEqual> weights_;
  node_type* keep_ = nullptr;  // the entry release_node() is releasing
};

}  // namespace sluice

#endif  // SLUICE_FAIR_SEMAPHORE_HPP
