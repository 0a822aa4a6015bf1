// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_ACQUIRE_ALL_HPP
#define SLUICE_ACQUIRE_ALL_HPP

#include <sluice/adaptive_limit.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/rate_core.hpp>
#include <sluice/event.hpp>
#include <sluice/keyed_semaphore.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/time.hpp>

#include <sluice/detail/asio.hpp>

#include <array>
#include <cstddef>
#include <list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace sluice {

/// One key of a `keyed_semaphore` as a budget of `sluice::acquire_all`:
/// `sluice::acquire_all(sluice::for_key(accounts, id), rpm)`.
template <class Key, class Hash, class KeyEqual>
struct keyed_budget {
  keyed_semaphore<Key, Hash, KeyEqual>* semaphore;  ///< must outlive the call
  Key key;                                          ///< the key to take a permit of
};

/// `key` of `ks` as a budget of `sluice::acquire_all`.
template <class Key, class Hash, class KeyEqual>
[[nodiscard]] keyed_budget<Key, Hash, KeyEqual> for_key(keyed_semaphore<Key, Hash, KeyEqual>& ks,
                                                        Key key) {
  return {&ks, std::move(key)};
}

namespace detail {

// ---- budgets: what acquire_all knows of each kind ---------------------------
//
// A budget B has: held (move-only; destroying a held permit releases it, a
// held rate start is kept), id() (the object and, for a keyed semaphore, the
// key's hash: two calls conflict when they share one, for FIFO among
// acquire_all callers), wait_take() (the primitive's own FIFO wait; takes at its grant),
// undo(held&) (gives a grant back exactly), and either
//   peek == false: try_take() -> optional<held> (undone by undo), or
//   peek == true:  ready(ex) (could take now, nothing taken) and take(ex).

// Which budget: the object and a part of it (a key's hash; 0 for the whole).
using budget_id = std::pair<const void*, std::size_t>;

struct semaphore_budget {
  static constexpr bool peek = false;
  semaphore* s;

  // A permit taken with acquire(); released on destruction.
  class held {
   public:
    held() noexcept = default;
    explicit held(semaphore* s) noexcept : s_(s) {}
    held(held&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    held& operator=(held&& o) noexcept {
      if (this != &o) {
        reset();
        s_ = std::exchange(o.s_, nullptr);
      }
      return *this;
    }
    ~held() { reset(); }
    explicit operator bool() const noexcept { return s_ != nullptr; }
    void reset() noexcept {
      if (auto* s = std::exchange(s_, nullptr)) s->release();
    }

   private:
    semaphore* s_ = nullptr;
  };

  budget_id id() const noexcept { return {s, 0}; }
  std::optional<held> try_take(const asio::any_io_executor&) const {
    if (!s->try_acquire()) return std::nullopt;
    return held(s);
  }
  template <class = void>  // a template: compiled only in the TUs that call it (issue 32)
  asio::awaitable<held> wait_take() const {
    co_await s->acquire();
    co_return held(s);
  }
  static void undo(held& h) noexcept { h.reset(); }
};

template <class Key, class Hash, class KeyEqual>
struct keyed_semaphore_budget {
  static constexpr bool peek = false;
  keyed_budget<Key, Hash, KeyEqual> b;
  using held = typename keyed_semaphore<Key, Hash, KeyEqual>::permit;

  budget_id id() const { return {b.semaphore, Hash{}(b.key)}; }
  std::optional<held> try_take(const asio::any_io_executor&) const {
    return b.semaphore->try_acquire(b.key);
  }
  template <class = void>  // a template: compiled only in the TUs that call it (issue 32)
  asio::awaitable<held> wait_take() const {
    return b.semaphore->scoped_acquire(b.key);
  }
  static void undo(held& h) noexcept { h.reset(); }
};

struct adaptive_budget {
  static constexpr bool peek = false;
  adaptive_limit* cap;
  using held = adaptive_limit::permit;  // report the call's outcome through it

  budget_id id() const noexcept { return {cap, 0}; }
  std::optional<held> try_take(const asio::any_io_executor& ex) const {
    held p = cap->try_acquire(ex);
    if (!p) return std::nullopt;
    return p;
  }
  template <class = void>  // a template: compiled only in the TUs that call it (issue 32)
  asio::awaitable<held> wait_take() const {
    return cap->scoped_acquire();
  }
  static void undo(held& h) noexcept { h.reset(); }
};

template <class Policy>
struct rate_budget {
  static constexpr bool peek = true;
  rate_limiter_api<Policy>* r;
  std::size_t n;

  // A start (or n tokens) taken at `at`; kept when destroyed, and on the
  // steady clock a sliding window counts it from then on (the call's
  // completion) instead of from `at` (rate_core::restamp).
  struct held {
    rate_limiter_api<Policy>* r = nullptr;
    std::size_t n = 0;
    clock::time_point at{};

    held() noexcept = default;
    held(rate_limiter_api<Policy>* l, std::size_t count, clock::time_point t) noexcept
        : r(l), n(count), at(t) {}
    held(held&& o) noexcept : r(std::exchange(o.r, nullptr)), n(o.n), at(o.at) {}
    held& operator=(held&& o) noexcept {
      if (this != &o) {
        reset();
        r = std::exchange(o.r, nullptr);
        n = o.n;
        at = o.at;
      }
      return *this;
    }
    ~held() { reset(); }
    // The call is done: the start counts from now (real time).
    void reset() noexcept {
      if (auto* l = std::exchange(r, nullptr)) rate_access::core(*l).restamp(n, at);
    }
  };

  budget_id id() const noexcept { return {r, 0}; }
  bool ready(const asio::any_io_executor& ex) const { return rate_access::core(*r).ready(n, ex); }
  held take(const asio::any_io_executor& ex) const {
    return {r, n, rate_access::core(*r).take_ready(n, ex)};
  }
  template <class = void>  // a template: compiled only in the TUs that call it (issue 32)
  asio::awaitable<held> wait_take() const {
    const clock::time_point at = co_await rate_access::core(*r).acquire_granted(n);
    co_return held{r, n, at};
  }
  static void undo(held& h) {
    if (auto* l = std::exchange(h.r, nullptr)) rate_access::core(*l).give_back(h.n, h.at);
  }
};

inline semaphore_budget make_budget(semaphore& s) noexcept {
  return {&s};
}
inline adaptive_budget make_budget(adaptive_limit& a) noexcept {
  return {&a};
}
template <class Key, class Hash, class KeyEqual>
keyed_semaphore_budget<Key, Hash, KeyEqual> make_budget(keyed_budget<Key, Hash, KeyEqual> b) {
  return {std::move(b)};
}
template <class Policy>
rate_budget<Policy> make_budget(rate_limiter_api<Policy>& r) noexcept {
  return {&r, 1};
}
template <class Policy>
rate_budget<Policy> make_budget(weighted_units<Policy> w) noexcept {
  return {w.limiter, w.n};
}

template <class B>
concept all_budget_source = requires(B&& b) {
  make_budget(std::forward<B>(b));
};

// True when two budgets draw on one count: the same semaphore, adaptive_limit
// or limiter, or the same key of one keyed_semaphore (keys that only share a
// hash are two budgets).
template <class A, class B>
bool same_budget(const A&, const B&) noexcept {
  return false;
}
template <class A>
bool same_budget(const A& a, const A& b) noexcept {
  return a.id() == b.id();
}
template <class Key, class Hash, class KeyEqual>
bool same_budget(const keyed_semaphore_budget<Key, Hash, KeyEqual>& a,
                 const keyed_semaphore_budget<Key, Hash, KeyEqual>& b) {
  return a.b.semaphore == b.b.semaphore && KeyEqual{}(a.b.key, b.b.key);
}

// A budget named twice is refused before anything is taken: both halves of a
// limiter would be peeked free and taken together past its quota, and a
// semaphore named twice could be granted to one half and refused to the
// other at every turn, without ever suspending.
template <class Budgets, std::size_t... I>
void check_distinct(const Budgets& bs, std::index_sequence<I...>) {
  bool twice = false;
  const auto row = [&](auto index) {
    constexpr std::size_t a = decltype(index)::value;
    ((twice = twice || (a < I && same_budget(std::get<a>(bs), std::get<I>(bs)))), ...);
  };
  (row(std::integral_constant<std::size_t, I>{}), ...);
  if (twice) {
    throw std::invalid_argument(
        "sluice::acquire_all: a budget is named twice (the same semaphore, adaptive_limit, "
        "limiter or key); name each once, and for a limiter ask for the sum: weighted(a + b)");
  }
}

// ---- FIFO among acquire_all callers -----------------------------------------

// One pending acquire_all: the budgets it names; `left` is set when it ends.
// Calls behind it wait on `left`, and their frames own this entry: a cycle
// that `left` being set breaks, or (the loop's end) `left` being destroyed.
struct all_waiter {
  std::vector<budget_id> ids;
  std::optional<event> left{std::in_place};
  bool listed = false;
  std::list<std::shared_ptr<all_waiter>>::iterator at;

  bool conflicts(const all_waiter& o) const noexcept {
    for (const auto& a : ids)
      for (const auto& b : o.ids)
        if (a == b) return true;
    return false;
  }
};

// The pending acquire_all calls of one execution context, oldest first. A call
// may take only when no older pending call names one of its budgets: the
// oldest is never held back, so there is no deadlock, and a younger call that
// shares a budget never overtakes it.
class acquire_all_service final : public asio::execution_context::service {
 public:
  using key_type = acquire_all_service;
  inline static asio::execution_context::id id;

  explicit acquire_all_service(asio::execution_context& ctx)
      : asio::execution_context::service(ctx) {}

  std::shared_ptr<all_waiter> enqueue(std::vector<budget_id> ids) {
    auto w = std::make_shared<all_waiter>();
    w->ids = std::move(ids);
    pending_.push_back(w);
    w->at = std::prev(pending_.end());
    w->listed = true;
    return w;
  }

  // The youngest pending call older than `w` that shares a budget with it.
  std::shared_ptr<all_waiter> older_conflict(const all_waiter& w) const {
    for (auto it = w.at; it != pending_.begin();) {
      --it;
      if ((*it)->conflicts(w)) return *it;
    }
    return nullptr;
  }

  // `w` ends (granted, cancelled or failed): the calls behind it look again.
  void leave(all_waiter& w) {
    if (!w.listed || down_) return;
    w.listed = false;
    pending_.erase(w.at);
    w.left->set();
  }

 private:
  void shutdown() override {
    down_ = true;  // frames destroyed from here on must not post wake-ups
    // A call waiting for an older one to leave is owned by that one's event,
    // which its own frame keeps alive: destroying the event aborts its wait
    // through a post the dying loop drops (or a shut strand destroys at
    // once), and that frees the frame. Kept alive here until all are done.
    const std::list<std::shared_ptr<all_waiter>> pending = std::move(pending_);
    pending_.clear();
    for (const auto& w : pending) w->listed = false;
    for (const auto& w : pending) w->left.reset();
  }

  std::list<std::shared_ptr<all_waiter>> pending_;
  bool down_ = false;
};

struct all_leave_guard {
  acquire_all_service& svc;
  std::shared_ptr<all_waiter> w;
  ~all_leave_guard() { svc.leave(*w); }
};

inline constexpr std::size_t all_taken = static_cast<std::size_t>(-1);

// Takes every budget but `skip` now, or none: permits first (each given back
// if a later budget is not free), then the rate budgets, all peeked before any
// is taken. Returns all_taken, or the index of the first budget not free.
template <class Budgets, class Parts, std::size_t... I>
std::size_t take_all_now(const Budgets& bs, Parts& parts, const asio::any_io_executor& ex,
                         std::size_t skip, std::index_sequence<I...>) {
  std::size_t failed = all_taken;
  const auto try_permit = [&](auto index) {
    constexpr std::size_t i = decltype(index)::value;
    const auto& b = std::get<i>(bs);
    if constexpr (!std::remove_cvref_t<decltype(b)>::peek) {
      if (failed != all_taken || i == skip) return;
      if (auto h = b.try_take(ex)) {
        std::get<i>(parts).emplace(std::move(*h));
      } else {
        failed = i;
      }
    }
  };
  const auto peek_rate = [&](auto index) {
    constexpr std::size_t i = decltype(index)::value;
    const auto& b = std::get<i>(bs);
    if constexpr (std::remove_cvref_t<decltype(b)>::peek) {
      if (failed == all_taken && i != skip && !b.ready(ex)) failed = i;
    }
  };
  (try_permit(std::integral_constant<std::size_t, I>{}), ...);
  (peek_rate(std::integral_constant<std::size_t, I>{}), ...);
  if (failed != all_taken) {
    const auto undo = [&](auto index) {
      constexpr std::size_t i = decltype(index)::value;
      if (i == skip) return;
      auto& part = std::get<i>(parts);
      if (part) {
        std::remove_cvref_t<decltype(std::get<i>(bs))>::undo(*part);
        part.reset();
      }
    };
    (undo(std::integral_constant<std::size_t, I>{}), ...);
    return failed;
  }
  const auto take_rate = [&](auto index) {
    constexpr std::size_t i = decltype(index)::value;
    const auto& b = std::get<i>(bs);
    if constexpr (std::remove_cvref_t<decltype(b)>::peek) {
      if (i != skip) std::get<i>(parts).emplace(b.take(ex));
    }
  };
  (take_rate(std::integral_constant<std::size_t, I>{}), ...);
  return all_taken;
}

// Waits for budget I in its own FIFO (taking it at its grant), then takes the
// rest at that instant; if they are not all free, gives I back. True when
// everything is held.
template <std::size_t I, class Budgets, class Parts>
asio::awaitable<bool> wait_then_take(const Budgets& bs, Parts& parts,
                                     const asio::any_io_executor& ex) {
  auto h = co_await std::get<I>(bs).wait_take();
  if (take_all_now(bs, parts, ex, I, std::make_index_sequence<std::tuple_size_v<Budgets>>{}) ==
      all_taken) {
    std::get<I>(parts).emplace(std::move(h));
    co_return true;
  }
  std::remove_cvref_t<decltype(std::get<I>(bs))>::undo(h);
  co_return false;
}

struct all_held_access;
// What an all_held holds: one part per budget, filled once taken.
template <class... B>
using all_parts = std::tuple<std::optional<typename B::held>...>;
}  // namespace detail

/// What `sluice::acquire_all` took: the permits it holds (released on
/// destruction or `release()`) and the rate starts it recorded (kept; in real
/// time counted from that instant on). Must not outlive the budgets.
/// Move-only.
///
/// `get<I>()` is the I-th budget's part: a `keyed_semaphore::permit` for a
/// key, an `adaptive_limit::permit` (report the call's outcome through it:
/// `succeeded()`, `throttled()`, `dropped()`; destroyed unreported it
/// releases without feedback), a permit-like handle for a `semaphore`
/// (`reset()`), and for a `rate_limiter` / `token_bucket` the start it
/// recorded (`.at`, `.n`).
template <class... Budgets>
class all_held {
 public:
  /// Takes over what `o` holds; `o` is left holding nothing.
  all_held(all_held&&) noexcept = default;
  /// Releases what this holds, then takes over what `o` holds.
  all_held& operator=(all_held&&) noexcept = default;
  all_held(const all_held&) = delete;
  all_held& operator=(const all_held&) = delete;
  ~all_held() {}  // user-provided: `auto held = co_await acquire_all(rpm);` is not "unused"

  /// The part of budget `I`.
  template <std::size_t I>
  [[nodiscard]] auto& get() noexcept {
    return *std::get<I>(parts_);
  }

  /// The call is done: releases every permit now (rate starts stay recorded,
  /// counted from now in real time). Idempotent.
  void release() noexcept {
    std::apply([](auto&... p) { (p.reset(), ...); }, parts_);
  }

 private:
  friend struct detail::all_held_access;
  explicit all_held(detail::all_parts<Budgets...>&& p) noexcept : parts_(std::move(p)) {}
  detail::all_parts<Budgets...> parts_;
};

namespace detail {

struct all_held_access {
  template <class... B>
  static all_held<B...> make(all_parts<B...>&& p) noexcept {
    return all_held<B...>(std::move(p));
  }
};

template <class... B, std::size_t... I>
asio::awaitable<all_held<B...>> acquire_all_op(std::tuple<B...> bs, std::index_sequence<I...> seq) {
  const auto state = co_await asio::this_coro::cancellation_state;
  if (state.cancelled() != asio::cancellation_type::none)
    throw system_error(asio::error::operation_aborted, "sluice::acquire_all");
  const asio::any_io_executor ex = co_await asio::this_coro::executor;
  auto& ctx = asio::query(ex, asio::execution::context_as<asio::execution_context&>);
  auto& svc = asio::use_service<acquire_all_service>(ctx);
  const all_leave_guard guard{svc, svc.enqueue({std::get<I>(bs).id()...})};
  all_parts<B...> parts;
  using budgets_type = std::tuple<B...>;
  using wait_fn = asio::awaitable<bool> (*)(const budgets_type&, decltype(parts)&,
                                            const asio::any_io_executor&);
  static constexpr std::array<wait_fn, sizeof...(B)> waits{
      &wait_then_take<I, budgets_type, decltype(parts)>...};
  for (;;) {
    if (auto older = svc.older_conflict(*guard.w)) {
      co_await older->left->wait();  // FIFO: the older call goes first
      continue;
    }
    const std::size_t failed = take_all_now(bs, parts, ex, all_taken, seq);
    if (failed == all_taken) break;
    if (co_await waits[failed](bs, parts, ex)) break;
  }
  co_return all_held_access::make<B...>(std::move(parts));
}

}  // namespace detail

/// Takes several budgets at once — a concurrency permit, a start in a
/// requests-per-minute window, tokens of a tokens-per-minute budget — in one
/// instant, or none of them. Returns an `all_held` that releases the permits
/// when destroyed.
///
/// Budgets: `semaphore&` (one permit), `sluice::for_key(keyed, key)` (a permit
/// of that key), `adaptive_limit&` (a place under its current limit),
/// `rate_limiter&` / `token_bucket&` (one start, one token),
/// `limiter.weighted(n)` (n of them: `tpm.weighted(tokens)`).
///
/// - One instant: nothing is held and no start is recorded while the call
///   waits on another budget. It waits on one budget at a time in that
///   budget's own FIFO; when granted, it takes the others at the same instant
///   if they are all free, else gives the grant back exactly (a rate start is
///   removed, a permit released) and waits on the one that was not free. With
///   every caller going through `acquire_all`, it is granted at the earliest
///   instant all budgets are free.
/// - FIFO among `acquire_all` callers on the same execution context: a call
///   does not take while an older pending call names one of its budgets (a
///   large token request at the head is not overtaken by small ones; calls on
///   disjoint budgets do not wait for each other). Callers of the budgets'
///   own `acquire` are not ordered against `acquire_all` callers.
/// - Rate starts are recorded at the instant of the grant of all (exact in
///   virtual time). On the steady clock, when the `all_held` is destroyed
///   (or `release()`d: the call is done), a `rate_limiter`'s start counts from
///   that instant instead: the provider counted the request before it
///   answered, so the start that reuses its place arrives at least `per`
///   after it however long the request travelled (see `rate_limiter`: Real
///   time). Destroy it when the call completes.
/// - Per-Operation Cancellation: as the budgets' own waits (terminal,
///   partial, total): a cancelled call holds nothing and recorded nothing,
///   and a caller cancelled before the call takes nothing and throws
///   `system_error(operation_aborted)`.
/// - Resumes on the caller's executor. Loop-affine, as the budgets.
/// - Throws `std::invalid_argument` at the call for a weight a limiter could
///   never grant (from `weighted(n)`), and for a budget named twice (the same
///   semaphore, `adaptive_limit`, limiter, or key of a `keyed_semaphore`):
///   name each once; for a limiter, ask for the sum (`tpm.weighted(a + b)`).
///
/// @code
/// sluice::semaphore in_flight{8};
/// sluice::rate_limiter rpm{60, 1min}, tpm{40000, 1min};
/// auto held = co_await sluice::acquire_all(in_flight, rpm, tpm.weighted(prompt_tokens));
/// co_return co_await llm.complete(prompt);   // held releases the permit at scope exit
/// @endcode
template <class... Budgets>
requires(sizeof...(Budgets) > 0 && (detail::all_budget_source<Budgets> && ...))
    [[nodiscard]] auto acquire_all(Budgets&&... budgets) {
  auto bs = std::make_tuple(detail::make_budget(std::forward<Budgets>(budgets))...);
  detail::check_distinct(bs, std::index_sequence_for<Budgets...>{});
  return detail::acquire_all_op(std::move(bs), std::index_sequence_for<Budgets...>{});
}

}  // namespace sluice

#endif  // SLUICE_ACQUIRE_ALL_HPP
