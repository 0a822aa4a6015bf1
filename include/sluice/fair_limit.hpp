// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_FAIR_LIMIT_HPP
#define SLUICE_FAIR_LIMIT_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/fair_rotation.hpp>
#include <sluice/detail/waiter_list.hpp>
#include <sluice/fair_limit_key.hpp>
#include <sluice/fair_share.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <unordered_map>
#include <utility>

namespace sluice {

/// Fair shares between keys (tenants) for any limit `L`: a gate in front of
/// `L` that lets one call at a time into `L`'s own queue, picking the next key
/// by deficit round robin over the keys with waiters, by weight. A noisy
/// key's backlog then waits at the gate, in its own queue, instead of ahead
/// of everyone in `L`'s FIFO.
///
/// - `L` is built inside from the constructor's arguments and keeps its own
///   semantics, hot path and stats (`underlying()`): `fair_limit<rate_limiter,
///   std::string> rpm{60, 1min}`; `fair_limit<adaptive_limit, int>
///   cap{adaptive_limit::options{...}}`. Permit limits (`permit_limit`) are
///   taken with `scoped_acquire(key)`, one permit per call; unit limits
///   (`unit_limit`) with `acquire(key, n)`: n units (tokens of a tokens-per-
///   minute budget), the key's deficit counted in units.
/// - Fairness: an idle gate lets a call straight into `L` (granted at once if
///   `L` has room, as without the gate); a key with no waiters takes nothing.
///   While `L` is contended, calls queue per key (FIFO within a key) and the
///   call in `L` is followed by the next key in turn: a key in turn gets
///   `weight` units of credit per round and spends them on its calls' units,
///   so over backlogged keys the units granted follow the weights, within
///   one call's units. Fairness is among the gate's callers: calls made on
///   `L` directly are not ordered against them.
/// - Why a gate and not an option of each limit: one rotation serves every
///   limit kind, and their hot paths stay untouched. The price: under
///   contention each grant wakes the next key's call, which then enters `L`
///   (one post more per grant; zero time in virtual time).
///   `fair_semaphore` is the same rotation built into a semaphore (no second
///   post).
/// - Weights: `set_weight(key, w)` (default 1), kept until changed; applies
///   from the key's next turn.
/// - What resumes where: every call resumes on its own executor; a turn is
///   never handed on inline (posted).
/// - Per-Operation Cancellation (terminal, partial, total): a call cancelled
///   at the gate leaves its key's queue holding nothing; one cancelled inside
///   `L` has `L`'s atomicity (removed, or granted and passed on by `L`); in
///   both cases the turn goes on to the next call. A coroutine cancelled before
///   it called is refused at once (`operation_aborted`), taking nothing. A
///   call whose loop is destroyed while it waits gives its turn back.
/// - Stats per key (`stats(key)`): calls waiting, permits in use, weight,
///   share of the units of the last `window` grants.
/// - Throws `std::invalid_argument`: `window == 0`, a weight that is not a
///   finite number > 0, `n == 0` or an `n` `L` could never grant (at the
///   call). What `L` throws reaches the caller.
/// - Lifetimes: loop-affine (from several threads:
///   `strand_bound<fair_limit<L, Key>>`). Destroying it with calls waiting
///   ends them with `operation_aborted`; permits must not outlive it.
/// - In a call policy: `for_key(key)` is a limit of its own for one key
///   (`sluice::shed(tenant_view, {...})`).
/// - Redis: there is no fair Redis limit. One script could keep the per-key
///   queues and deficits in one hash slot, but each grant would walk the keys
///   inside the server, blocking it, for waiters that renew their tickets on
///   their own clocks; a fleet gets fair shares by putting this gate in front
///   of `redis::semaphore` / `redis::rate_limiter` in each process (fair per
///   process, the fleet cap still global).
///
/// @code
/// sluice::fair_limit<sluice::rate_limiter, std::string> tpm{40000, std::chrono::minutes(1)};
/// tpm.set_weight("enterprise", 4);
/// auto ask = [&](std::string tenant, prompt p) -> asio::awaitable<reply> {
///   co_await tpm.acquire(tenant, p.tokens);   // tokens per minute, shared by weight
///   co_return co_await llm.complete(p);
/// };
/// @endcode
template <class L, class Key, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class fair_limit {
  struct ticket;
  struct entry {
    detail::waiter_list queue;  // this key's calls waiting for their turn
    double weight = 1.0;
    double deficit = 0.0;
    std::size_t in_window = 0;  // units among the last window_ grants
    std::size_t in_use = 0;     // permits held
    std::size_t pending = 0;    // calls not granted yet
    std::size_t users = 0;      // calls and permits that point here
    bool active = false;        // in rotation_
    const Key* key = nullptr;   // its key in map_
  };
  // A call waiting at the gate: its node in the key's queue.
  struct turn_wait : detail::wait_op {
    explicit turn_wait(ticket* t) noexcept : call(t) {}
    ticket* call;
  };
  // One call, in its coroutine's frame; gives its turn back on every way out
  // (also a frame destroyed with its loop), unless the gate is gone.
  struct ticket {
    fair_limit* gate;
    entry* e;
    std::size_t units;
    std::weak_ptr<void> alive;
    bool picked = false;   // given the turn by the rotation (its units charged)
    bool granted = false;  // granted by L
    ticket(fair_limit& g, entry* en, std::size_t n) : gate(&g), e(en), units(n), alive(g.life_) {
      ++e->users;
      ++e->pending;
      ++g.pending_;
    }
    ticket(const ticket&) = delete;
    ticket& operator=(const ticket&) = delete;
    ~ticket() {
      if (!alive.expired()) gate->leave(*this);
    }
  };
  using map_type = std::unordered_map<Key, entry, Hash, KeyEqual>;
  struct no_permit {};  // a unit limit's calls hold nothing
  template <class T>
  struct inner_permit {
    using type = no_permit;
  };
  template <permit_limit T>
  struct inner_permit<T> {
    using type = task_result_t<decltype(std::declval<T&>().scoped_acquire())>;
  };

 public:
  /// The limit behind the gate.
  using limit_type = L;
  /// The key type.
  using key_type = Key;

  /// A permit of `L` taken for one key (permit limits): releases it on
  /// destruction or `reset()`. `get()` / `->` reach `L`'s own permit
  /// (`adaptive_limit`: report the outcome through it). Must not outlive the
  /// `fair_limit`. Move-only.
  class permit {
   public:
    /// `L`'s permit type.
    using inner_type = typename inner_permit<L>::type;
    /// An empty permit that owns nothing.
    permit() noexcept = default;
    /// Takes over `o`'s permit.
    permit(permit&& o) noexcept
        : gate_(std::exchange(o.gate_, nullptr)), e_(o.e_), inner_(std::move(o.inner_)) {}
    /// Releases this permit, then takes over `o`'s.
    permit& operator=(permit&& o) noexcept {
      if (this != &o) {
        reset();
        gate_ = std::exchange(o.gate_, nullptr);
        e_ = o.e_;
        inner_ = std::move(o.inner_);
      }
      return *this;
    }
    ~permit() { reset(); }
    /// True while it owns a permit.
    explicit operator bool() const noexcept { return gate_ != nullptr; }
    /// The key it was taken for. Precondition: it owns a permit.
    [[nodiscard]] const Key& key() const noexcept { return *e_->key; }
    /// `L`'s permit. Precondition: it owns a permit.
    [[nodiscard]] inner_type& get() noexcept { return *inner_; }
    /// `L`'s permit. Precondition: it owns a permit.
    inner_type* operator->() noexcept { return &*inner_; }
    /// Releases the permit now (no-op when empty).
    void reset() noexcept {
      if (auto* g = std::exchange(gate_, nullptr)) {
        inner_.reset();
        g->put_back(e_);
      }
    }

   private:
    friend class fair_limit;
    permit(fair_limit& g, entry* e, inner_type&& p) : gate_(&g), e_(e), inner_(std::move(p)) {}
    fair_limit* gate_ = nullptr;
    entry* e_ = nullptr;
    std::optional<inner_type> inner_;
  };

  /// One key as a limit of its own, for a call policy: `for_key(key)`.
  using key_view = fair_limit_key<fair_limit>;

  /// Builds `L{args...}` behind the gate.
  template <class... Args>
  requires std::constructible_from<L, Args&&...>
  explicit fair_limit(Args&&... args)
      : limit_(std::forward<Args>(args)...), window_(fair_options{}.window) {}

  /// As above, with options: `fair_limit<L, K>{fair_options{.window = 100}, args...}`.
  template <class... Args>
  requires std::constructible_from<L, Args&&...>
  explicit fair_limit(fair_options o, Args&&... args)
      : limit_(std::forward<Args>(args)...), window_(check(o).window) {}

  /// With an executor: `L{ex, args...}` (how `strand_bound` builds it).
  template <class Executor, class... Args>
  requires(asio::execution::is_executor<Executor>::value || asio::is_executor<Executor>::value) &&
      std::constructible_from<L, const Executor&, Args&&...> fair_limit(const Executor& ex,
                                                                        fair_options o,
                                                                        Args&&... args)
      : limit_(ex, std::forward<Args>(args)...),
  window_(check(o).window) {}

  fair_limit(const fair_limit&) = delete;
  fair_limit& operator=(const fair_limit&) = delete;
  /// Ends the calls waiting at the gate with `operation_aborted` (those in
  /// `L` end with `L`).
  ~fair_limit() {
    life_.reset();
    for (auto& [k, e] : map_) detail::abort_all(e.queue);
  }

  /// Waits for `key`'s turn, then for a permit of `L`. Throws
  /// `system_error(operation_aborted)` when cancelled (holding nothing),
  /// and what `L` throws.
  template <class T = L>
  requires permit_limit<T>
  [[nodiscard]] asio::awaitable<permit> scoped_acquire(Key key) {
    const auto cs = co_await asio::this_coro::cancellation_state;
    detail::refuse_if_cancelled(cs, name);
    ticket t(*this, node_for(key), 1);
    if (passage_ != nullptr) co_await wait_turn(t);
    detail::refuse_if_cancelled(cs, name);  // its turn came after the cancellation: passed on
    passage_ = &t;
    auto inner = co_await limit_.scoped_acquire();
    if (t.alive.expired()) throw system_error(asio::error::operation_aborted, name);
    granted(t, 1);
    ++t.e->in_use;
    ++t.e->users;
    co_return permit(*this, t.e, std::move(inner));
  }

  /// Waits for `key`'s turn, then for `n` units of `L` (a start, tokens),
  /// which stay taken. Throws `std::invalid_argument` for an `n` `L` could
  /// never grant, `system_error(operation_aborted)` when cancelled (taking
  /// nothing; a grant `L` made before the cancellation reached it stays as
  /// `L` keeps it), and what `L` throws.
  template <class T = L>
  requires unit_limit<T>
  [[nodiscard]] asio::awaitable<void> acquire(Key key, std::size_t n = 1) {
    check_units(n);
    const auto cs = co_await asio::this_coro::cancellation_state;
    detail::refuse_if_cancelled(cs, name);
    ticket t(*this, node_for(key), n);
    if (passage_ != nullptr) co_await wait_turn(t);
    detail::refuse_if_cancelled(cs, name);
    passage_ = &t;
    co_await limit_.acquire(n);
    if (t.alive.expired()) throw system_error(asio::error::operation_aborted, name);
    granted(t, n);
  }

  /// `n` units for `key` if the gate is idle and `L` grants them now (a
  /// `try_acquire(n)` of `L`); never suspends.
  template <class T = L>
  requires unit_limit<T> && requires(T& l, std::size_t n) {
    { l.try_acquire(n) } -> std::same_as<bool>;
  }
  [[nodiscard]] bool try_acquire(const Key& key, std::size_t n = 1) {
    check_units(n);
    if (passage_ != nullptr || !limit_.try_acquire(n)) return false;
    ticket t(*this, node_for(key), n);
    granted(t, n);
    return true;
  }

  /// `key` as a limit of its own (see `key_view`).
  [[nodiscard]] key_view for_key(Key key) { return key_view(*this, std::move(key)); }

  /// Sets `key`'s weight (default 1): credit per round, in `L`'s units.
  /// Throws `std::invalid_argument` unless `w` is finite and > 0.
  void set_weight(const Key& key, double w) { weights_.set(map_, key, w, name); }

  /// What `key` does now (see `fair_share`). O(1).
  [[nodiscard]] fair_share stats(const Key& key) const {
    fair_share s{.weight = weights_.of(key)};
    if (auto it = map_.find(key); it != map_.end()) {
      s.waiting = it->second.pending;
      s.in_use = it->second.in_use;
      s.share = window_.share(it->second);
    }
    return s;
  }
  /// Calls not granted yet, every key together (at the gate or in `L`).
  [[nodiscard]] std::size_t waiters() const noexcept { return pending_; }
  /// Calls of `key` not granted yet.
  [[nodiscard]] std::size_t waiters(const Key& key) const { return stats(key).waiting; }
  /// Keys with an entry now (calling, holding, or among the last grants).
  [[nodiscard]] std::size_t keys() const noexcept { return map_.size(); }
  /// The limit behind the gate (its own members and stats).
  [[nodiscard]] L& underlying() noexcept { return limit_; }
  /// As above, read-only.
  [[nodiscard]] const L& underlying() const noexcept { return limit_; }

 private:
  static constexpr const char* name = "sluice::fair_limit";

  static const fair_options& check(const fair_options& o) {
    if (o.window == 0) throw std::invalid_argument("sluice::fair_limit: window must be >= 1");
    return o;
  }
  void check_units(std::size_t n) {
    if (n == 0) throw std::invalid_argument("sluice::fair_limit: n must be >= 1");
    if constexpr (requires(L & l) { l.weighted(n); })
      static_cast<void>(limit_.weighted(n));  // checks n against L's quota only
  }

  entry* node_for(const Key& key) {
    auto [it, made] = map_.try_emplace(key);
    if (made) {
      it->second.key = &it->first;
      it->second.weight = weights_.of(key);
    }
    return &it->second;
  }

  // Queues t in its key's queue until the rotation hands it the turn.
  asio::awaitable<void> wait_turn(ticket& t) {
    co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(error_code)>(
        [self = this, &t](auto&& handler) {
          const auto how = detail::start_wait<turn_wait, detail::deliver_nothing>(
              std::forward<decltype(handler)>(handler), asio::any_io_executor{}, name, t.e->queue,
              false, true, &t);
          if (how == detail::wait_start::waiting) self->rotation_.join(t.e);
        },
        asio::use_awaitable_t<>{});
  }

  void granted(ticket& t, std::size_t n) {
    t.granted = true;
    --t.e->pending;
    --pending_;
    window_.record(t.e, n, [this](entry* old) { maybe_free(old); });
    if (passage_ == &t) open_passage();
  }

  // A call ends (granted or not): the turn goes on if it had it.
  void leave(ticket& t) noexcept {
    if (!t.granted) {
      --t.e->pending;
      --pending_;
      if (t.picked && t.e->active) t.e->deficit += double(t.units);  // unused credit
    }
    if (passage_ == &t) open_passage();
    --t.e->users;
    maybe_free(t.e);
  }

  void put_back(entry* e) noexcept {
    --e->in_use;
    --e->users;
    maybe_free(e);
  }

  // The call in L was granted or left: the next key in turn enters (posted).
  void open_passage() noexcept {
    passage_ = nullptr;
    rotation_.serve_next(
        [](entry* e) -> std::size_t {
          auto* w = static_cast<turn_wait*>(e->queue.front());
          return w == nullptr ? 0 : w->call->units;
        },
        [this](entry* e, std::size_t) {
          auto* w = static_cast<turn_wait*>(e->queue.pop_front());
          w->call->picked = true;
          passage_ = w->call;
          w->complete(error_code{});
        },
        [this](entry* e) { maybe_free(e); });
  }

  void maybe_free(entry* e) noexcept {
    if (!e->active && e->users == 0 && e->in_window == 0 && e->queue.empty()) map_.erase(*e->key);
  }

  L limit_;
  std::shared_ptr<int> life_ = std::make_shared<int>(0);  // expires with the gate
  map_type map_;
  detail::fair_rotation<entry> rotation_;
  detail::grant_window<entry> window_;
  detail::fair_weights<Key, Hash, KeyEqual> weights_;
  ticket* passage_ = nullptr;  // the call let into L (or handed the turn)
  std::size_t pending_ = 0;
};

}  // namespace sluice

#endif  // SLUICE_FAIR_LIMIT_HPP
