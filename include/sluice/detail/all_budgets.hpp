// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_ALL_BUDGETS_HPP
#define SLUICE_DETAIL_ALL_BUDGETS_HPP

// The budgets sluice::acquire_all takes, one struct per kind of limit.
//
// A budget B has: held (move-only; destroying a held permit releases it, a
// held rate start is kept), id() (the object and, for a keyed semaphore, the
// key's hash: two calls conflict when they share one, for FIFO among
// acquire_all callers), wait_take() (the limit's own FIFO wait; takes at its
// grant), give_back(held&) (returns a grant that was waited for exactly),
// undo(held&) (returns a grant that did not wait exactly, and uncounts it in
// the limit's stats: acquire_all took it only to find another budget busy),
// and a `kind`:
//   take_now:   try_take(ex) -> optional<held>, now, on the caller's thread;
//   peek:       ready(ex) (could take now, nothing taken) and take(ex);
//   take_async: try_take(ex) -> awaitable<optional<held>> (a limit on a
//               strand of its own: detail/all_strand_budget.hpp).

#include <sluice/adaptive_limit.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/rate_api.hpp>
#include <sluice/keyed_semaphore.hpp>
#include <sluice/semaphore.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <cstddef>
#include <optional>
#include <utility>

namespace sluice {

class shared_semaphore;

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

enum class budget_kind { take_now, peek, take_async };

// Which budget: the object and a part of it (a key's hash; 0 for the whole).
using budget_id = std::pair<const void*, std::size_t>;

// The limits' private parts acquire_all needs (each names it a friend).
struct budget_access {
  static void ungrant(semaphore& s) noexcept { s.core_.ungrant(); }
  template <class S>
  static void ungrant_shared(S& s) noexcept {
    s.core_.stats_sink().ungrant();
  }
  // Gives a key's permit taken by try_acquire() back, uncounted, no hold.
  template <class Permit>
  static void undo_key(Permit& p) noexcept {
    if (auto* s = std::exchange(p.sem_, nullptr)) {
      s->stats_.ungrant();
      s->release_node(std::exchange(p.node_, nullptr));
    }
  }
  // Releases a place acquire_all gives back: no hold sample, nothing for the
  // algorithm; a grant that did not wait is uncounted too.
  static void give_back(adaptive_limit::permit& p, bool uncount) noexcept {
    if (auto* c = std::exchange(p.cap_, nullptr)) {
      if (uncount) c->core_.ungrant();
      c->release_one();
    }
  }
};

// A permit of a semaphore (plain or shared): released on destruction.
template <class S>
class semaphore_held {
 public:
  semaphore_held() noexcept = default;
  explicit semaphore_held(S* s) noexcept : s_(s) {}
  semaphore_held(semaphore_held&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  semaphore_held& operator=(semaphore_held&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  ~semaphore_held() { reset(); }
  explicit operator bool() const noexcept { return s_ != nullptr; }
  void reset() noexcept {
    if (auto* s = std::exchange(s_, nullptr)) s->release();
  }
  // Gives the permit back and uncounts its grant.
  void undo() noexcept {
    if (auto* s = std::exchange(s_, nullptr)) {
      if constexpr (std::same_as<S, semaphore>) {
        budget_access::ungrant(*s);
      } else {
        budget_access::ungrant_shared(*s);
      }
      s->release();
    }
  }

 private:
  S* s_ = nullptr;
};

// A semaphore, a bounded_semaphore or a shared_semaphore.
template <class S>
struct semaphore_budget {
  static constexpr budget_kind kind = budget_kind::take_now;
  S* s;
  using held = semaphore_held<S>;

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
  static void give_back(held& h) noexcept { h.reset(); }
  static void undo(held& h) noexcept { h.undo(); }
};

template <class Key, class Hash, class KeyEqual>
struct keyed_semaphore_budget {
  static constexpr budget_kind kind = budget_kind::take_now;
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
  static void give_back(held& h) noexcept { h.reset(); }
  static void undo(held& h) noexcept { budget_access::undo_key(h); }
};

struct adaptive_budget {
  static constexpr budget_kind kind = budget_kind::take_now;
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
  static void give_back(held& h) noexcept { budget_access::give_back(h, false); }
  static void undo(held& h) noexcept { budget_access::give_back(h, true); }
};

template <class Policy>
struct rate_budget {
  static constexpr budget_kind kind = budget_kind::peek;
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
    explicit operator bool() const noexcept { return r != nullptr; }
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
  static void give_back(held& h) {
    if (auto* l = std::exchange(h.r, nullptr)) rate_access::core(*l).give_back(h.n, h.at);
  }
  static void undo(held& h) {
    if (auto* l = h.r) {
      give_back(h);
      rate_access::core(*l).ungrant();
    }
  }
};

inline semaphore_budget<semaphore> make_budget(semaphore& s) noexcept {
  return {&s};
}
template <std::same_as<shared_semaphore> S>
semaphore_budget<S> make_budget(S& s) noexcept {
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

}  // namespace detail
}  // namespace sluice

#endif  // SLUICE_DETAIL_ALL_BUDGETS_HPP
