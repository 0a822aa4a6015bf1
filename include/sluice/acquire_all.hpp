// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_ACQUIRE_ALL_HPP
#define SLUICE_ACQUIRE_ALL_HPP

#include <sluice/config.hpp>
#include <sluice/detail/all_budgets.hpp>
#include <sluice/detail/all_pending.hpp>
#include <sluice/detail/all_strand_budget.hpp>
#include <sluice/detail/all_take.hpp>

#include <sluice/detail/asio.hpp>

#include <array>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <utility>

namespace sluice {
namespace detail {

template <class B>
concept all_budget_source = requires(B&& b) {
  make_budget(std::forward<B>(b));
};

// True when two budgets draw on one count: the same semaphore, adaptive_limit
// or limiter, or the same key of one keyed_semaphore (keys that only share a
// hash are two budgets).
template <class A, class B>
bool same_budget(const A& a, const B& b) {
  return a.id() == b.id();  // a strand_bound and its underlying() limit too
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

struct all_held_access;
// What an all_held holds: one part per budget, filled once taken.
template <class... B>
using all_parts = std::tuple<std::optional<typename B::held>...>;
}  // namespace detail

/// True for what `sluice::acquire_all` takes as a budget (see there): a
/// `semaphore&`, `shared_semaphore&`, `adaptive_limit&`, `rate_limiter&`,
/// `token_bucket&`, `limiter.weighted(n)`, `for_key(keyed, key)`, a
/// `strand_bound<L>&` of one of these kinds, `bound.weighted(n)`. For code
/// that forwards a caller's mix of limits to `acquire_all` (a call policy).
template <class B>
concept acquire_all_budget = detail::all_budget_source<B>;

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
/// recorded (`.at`, `.n`). A `shared_semaphore` part is as a `semaphore`'s;
/// a `strand_bound` budget's part is a `strand_permit` of the limit's own
/// part (its release, and an `adaptive_limit` outcome, posted to the strand).
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
  const auto cs = co_await asio::this_coro::cancellation_state;
  refuse_if_cancelled(cs);
  const asio::any_io_executor ex = co_await asio::this_coro::executor;
  auto& pending = all_pending::instance();
  const all_leave_guard guard{pending.enqueue({std::get<I>(bs).id()...})};
  using budgets_type = std::tuple<B...>;
  using parts_type = all_parts<B...>;
  parts_type parts;
  parts_guard<budgets_type, parts_type> give_back{bs, parts};
  using wait_fn =
      asio::awaitable<bool> (*)(const budgets_type&, parts_type&, const asio::any_io_executor&,
                                const asio::cancellation_state&);
  static constexpr std::array<wait_fn, sizeof...(B)> waits{
      &wait_then_take<I, budgets_type, parts_type>...};
  for (;;) {
    if (auto older = pending.older_conflict(*guard.w)) {
      co_await wait_left(std::move(older));  // FIFO: the older call goes first
      refuse_if_cancelled(cs);
      continue;
    }
    const std::size_t failed = co_await take_all_now(bs, parts, ex, all_taken, seq);
    refuse_if_cancelled(cs);
    if (failed == all_taken) break;
    const bool all = co_await waits[failed](bs, parts, ex, cs);
    refuse_if_cancelled(cs);
    if (all) break;
  }
  give_back.armed = false;
  co_return all_held_access::make<B...>(std::move(parts));
}

}  // namespace detail

/// Takes several budgets at once — a concurrency permit, a start in a
/// requests-per-minute window, tokens of a tokens-per-minute budget — all of
/// them or none. Returns an `all_held` that releases the permits when
/// destroyed.
///
/// Budgets, any mix of:
/// - on the caller's loop (loop-affine: the call is made on the budget's own
///   thread or strand, as for its `acquire`): `semaphore&` /
///   `bounded_semaphore&` (one permit), `sluice::for_key(keyed, key)` (a permit
///   of that key), `adaptive_limit&` (a place under its current limit),
///   `rate_limiter&` / `token_bucket&` (one start, one token),
///   `limiter.weighted(n)` (n of them: `tpm.weighted(tokens)`);
/// - shared by every thread of a server: `shared_semaphore&`, and
///   `strand_bound<L>&` for `L` = `semaphore`, `bounded_semaphore`,
///   `adaptive_limit`, `rate_limiter`, `token_bucket` (one permit, place,
///   start or token), `bound.weighted(n)` for the limiters.
///
/// - All or none, never holding one budget while waiting on another: the call
///   waits on one budget at a time in that budget's own FIFO; when granted, it
///   tries the others, and if one is not free it gives back what it took,
///   exactly (a rate start removed, a permit released), and waits on that one.
///   The budgets on the caller's loop are tried, and rate starts recorded, in
///   one instant. A `strand_bound` budget is tried on its strand first, one
///   round trip each, taken there at once or not at all; what such a round
///   took is held only until the round ends (a few posts), and given back
///   if the round fails. With every caller going through `acquire_all`, a call
///   is granted at the earliest instant all its budgets are free.
/// - FIFO among `acquire_all` callers that share a budget, process-wide: a
///   call does not take while an older pending call names one of its budgets
///   (a large token request at the head is not overtaken by small ones), on
///   whatever thread, strand or `io_context` either runs. Calls on disjoint
///   budgets do not wait for each other; they share one mutex for a walk of
///   the pending calls. Callers of the budgets' own `acquire` are not ordered
///   against `acquire_all` callers.
/// - Rate starts are recorded at the instant of the grant of all (exact in
///   virtual time). On the steady clock, when the `all_held` is destroyed
///   (or `release()`d: the call is done), a `rate_limiter`'s start counts from
///   that instant instead: the provider counted the request before it
///   answered, so the start that reuses its place arrives at least `per`
///   after it however long the request travelled (see `rate_limiter`: Real
///   time). Destroy it when the call completes.
/// - Counts: a budget taken and given back without a wait (another was busy)
///   is not counted in its `stats().acquired` and records no hold (an
///   `adaptive_limit` no outcome either). A grant the call waited for in the
///   budget's FIFO and then gave back stays counted, its wait recorded (the
///   wait was real), with no hold for an `adaptive_limit`.
/// - Per-Operation Cancellation: as the budgets' own waits (terminal,
///   partial, total), and also while waiting behind an older call: a
///   cancelled call throws `system_error(operation_aborted)`, holds nothing
///   and recorded nothing, also when the cancellation arrives after what it
///   waited for was granted but before it resumed. A caller whose
///   cancellation was requested before it called (with
///   `throw_if_cancelled(false)`) takes nothing and throws at once.
/// - Resumes on the caller's executor.
/// - Throws `std::invalid_argument` at the call for a weight a limiter could
///   never grant (from `weighted(n)`), and for a budget named twice (the same
///   semaphore, `adaptive_limit`, limiter, or key of a `keyed_semaphore`; a
///   `strand_bound` and its `underlying()` limit are one budget): name each
///   once; for a limiter, ask for the sum (`tpm.weighted(a + b)`).
/// - Lifetimes: the budgets must outlive the call and the `all_held`.
///
/// @code
/// sluice::semaphore in_flight{8};
/// sluice::rate_limiter rpm{60, 1min}, tpm{40000, 1min};
/// auto held = co_await sluice::acquire_all(in_flight, rpm, tpm.weighted(prompt_tokens));
/// co_return co_await llm.complete(prompt);   // held releases the permit at scope exit
///
/// // a session of a 4-thread server, on its own strand:
/// sluice::shared_semaphore cap{8};                                   // shared by all
/// sluice::strand_bound<sluice::rate_limiter> rpm{asio::make_strand(ctx), 60, 1min};
/// auto held2 = co_await sluice::acquire_all(cap, rpm, session_sem); // session_sem: this strand's
/// @endcode
template <acquire_all_budget... Budgets>
requires(sizeof...(Budgets) > 0) [[nodiscard]] auto acquire_all(Budgets&&... budgets) {
  auto bs = std::make_tuple(detail::make_budget(std::forward<Budgets>(budgets))...);
  detail::check_distinct(bs, std::index_sequence_for<Budgets...>{});
  return detail::acquire_all_op(std::move(bs), std::index_sequence_for<Budgets...>{});
}

}  // namespace sluice

#endif  // SLUICE_ACQUIRE_ALL_HPP
