// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_ACQUIRE_ALL_HPP
#define SLUICE_REDIS_ACQUIRE_ALL_HPP

#include <sluice/config.hpp>
#include <sluice/redis/detail/all_ops.hpp>
#include <sluice/redis/detail/cluster_map.hpp>
#include <sluice/redis/detail/script.hpp>
#include <sluice/redis/rate_limiter.hpp>
#include <sluice/redis/semaphore.hpp>
#include <sluice/redis/semaphore_permit.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace sluice::detail {

// How acquire_all reaches the budgets' shared state.
struct redis_all_access {
  static redis_all_budget of(redis::semaphore& s) { return {s.st_, nullptr, 1}; }
  static redis_all_budget of(redis::rate_limiter& l) { return {nullptr, l.st_, 1}; }
  static redis_all_budget of(const redis::rate_limiter::weighted_budget& w) {
    return {nullptr, w.limiter.st_, w.n};
  }
};

template <class B>
concept redis_all_budget_source = requires(B&& b) {
  redis_all_access::of(std::forward<B>(b));
};

// Refuses, before anything is sent, a call that could not be one script on
// one node: budgets on different connections, keys in different slots, a
// budget named twice.
inline void redis_all_check(const std::vector<redis_all_budget>& bs,
                            const std::vector<std::string>& keys) {
  for (const auto& b : bs) {
    if (b.conn() != bs.front().conn())
      throw std::invalid_argument(
          "sluice::redis::acquire_all: every budget must use the same connection (one script "
          "runs on one server)");
  }
  for (const auto& k : keys) {
    if (redis_key_slot(k) != redis_key_slot(keys.front()))
      throw std::invalid_argument(
          "sluice::redis::acquire_all: the budgets' keys are in different Cluster slots (" +
          keys.front() + ", " + k +
          "); give the limits of one account one hash tag: names \"{account}:rpm\", "
          "\"{account}:tpm\", \"{account}:conc\"");
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    for (std::size_t j = i + 1; j < keys.size(); ++j) {
      if (keys[i] == keys[j])
        throw std::invalid_argument(
            "sluice::redis::acquire_all: a budget is named twice (" + keys[i] +
            "); name each once, and for a limiter ask for the sum: weighted(a + b)");
    }
  }
}

}  // namespace sluice::detail

namespace sluice::redis {

/// What `redis::acquire_all` took: a permit of each semaphore of the call
/// (released on destruction or `release()`, renewed meanwhile as any
/// `semaphore::permit`) and the starts it recorded in each rate limiter's
/// window (spent: they stay in the window). Move-only; the semaphores must
/// outlive it. Loop-affine, like its semaphores.
class all_held {
 public:
  /// Holds nothing.
  all_held() noexcept = default;
  /// Takes over what `o` holds; `o` is left holding nothing.
  all_held(all_held&&) noexcept = default;
  /// Releases what this holds, then takes over what `o` holds.
  all_held& operator=(all_held&&) noexcept = default;
  all_held(const all_held&) = delete;
  all_held& operator=(const all_held&) = delete;
  ~all_held() {}  // user-provided: `auto held = co_await acquire_all(...);` is not "unused"

  /// The permit of the `i`-th semaphore of the call (in the order the call
  /// named them, counting semaphores only). Throws `std::out_of_range`.
  [[nodiscard]] semaphore_permit& permit(std::size_t i = 0) { return permits_.at(i); }
  /// Permits held (the semaphores of the call; 0 after `release()`).
  [[nodiscard]] std::size_t permits() const noexcept { return permits_.size(); }
  /// The fencing token of the first semaphore's permit (see
  /// `semaphore::permit::fencing_token()`); 0 when the call named none.
  [[nodiscard]] std::int64_t fencing_token() const noexcept {
    return permits_.empty() ? 0 : permits_.front().fencing_token();
  }
  /// True once any permit's lease stopped being certain (see
  /// `redis::semaphore`).
  [[nodiscard]] bool lost() const noexcept {
    for (const auto& p : permits_)
      if (p.lost()) return true;
    return false;
  }
  /// The call is done: releases every permit now (the rate starts stay
  /// spent). Idempotent.
  void release() noexcept { permits_.clear(); }

  /// Wraps a grant (what `acquire_all` returns is made so).
  explicit all_held(detail::redis_all_grant&& g) noexcept : permits_(std::move(g.permits)) {}

 private:
  std::vector<semaphore_permit> permits_;
};

/// Takes several fleet-wide budgets of one account at once — a permit of a
/// `redis::semaphore` (concurrent requests), a start in a `redis::rate_limiter`
/// (requests per minute), `n` units of another (`tpm.weighted(tokens)`,
/// tokens per minute) — all of them or none, in one Lua script: one round
/// trip per attempt. Returns an `all_held` that releases the permits.
///
/// Budgets: `semaphore&` (one permit), `rate_limiter&` (one start),
/// `limiter.weighted(n)` (n starts), any mix, each named once, all on the
/// same connection (one server, a Sentinel-watched primary, or a Cluster) and
/// with their keys in one Cluster slot: name the limits of one account with
/// one hash tag (`"{acct-7}:rpm"`, `"{acct-7}:tpm"`, `"{acct-7}:conc"`). The
/// rule holds on one server too, so code that runs there runs on a Cluster.
///
/// All or none, FIFO: a call that cannot be served now is queued on every
/// budget it names, in the same script, and takes nothing. Two calls that
/// share budgets are in the same order on each of them, so they never wait
/// for each other. A call is served when on each budget its older waiters
/// still fit beside it: fewer older waiters than free permits (the
/// semaphore's own rule; plain `semaphore::acquire()` callers share that
/// queue), and the window's starts + the units older `acquire_all` callers
/// ask for + its own within `calls` (a large token request at the head is
/// not overtaken by small ones). Plain `rate_limiter::acquire()` callers are
/// not ordered against `acquire_all` callers. A call waits for the window to
/// have room (the script says how long), a semaphore's release announcement,
/// or a poll (the semaphores' `poll_interval`, 250 ms without one); a
/// waiter that stops asking for `waiter_ttl` (the semaphores' largest, 2.5 s
/// without one) loses its place.
///
/// The semaphore part is a `semaphore::permit` in every respect: lease,
/// renewals, certainty through Sentinel, fencing token (raised to the
/// highest token this process has seen), restart grace (no grant until the
/// grace after a `run_id` change has passed; waiters of the old node that do
/// not ask again leave the semaphore's and the call's rate queues at its
/// end; a call of rate limiters alone has no `run_id`, its stale waiters
/// leave after `waiter_ttl`). The rate starts are recorded at the instant of
/// the grant (server time) and spent; `n` units are `n` members of the
/// window, as for `rate_limiter::acquire(n)`.
///
/// What resumes where: on the awaiting coroutine's executor. Per-Operation
/// Cancellation (terminal, partial, total): the call ends at once with
/// `operation_aborted`, holding nothing: a script in flight, or a grant that
/// raced the cancellation, is taken back by a script pipelined behind it
/// (permits released, starts removed, places in the queues left). A caller
/// cancelled before it called throws without contacting the server.
///
/// Throws `std::invalid_argument` at once (before any round trip) for budgets
/// on different connections, keys in different slots, a budget named twice,
/// `weighted(n)` with `n == 0` or `n > calls`; `operation_aborted` when
/// cancelled or a semaphore was closed; `sluice::system_error` when the
/// connection fails (the call's entries are taken back on the next socket);
/// `server_error` if Redis rejects the script. Lifetime: the budgets must
/// outlive the call.
///
/// @code
/// auto conn = co_await sluice::redis::connect(ex, "127.0.0.1", 6379);
/// sluice::redis::rate_limiter rpm{conn, "{acct-7}:rpm", 500, std::chrono::minutes(1)};
/// sluice::redis::rate_limiter tpm{conn, "{acct-7}:tpm", 30000, std::chrono::minutes(1)};
/// sluice::redis::semaphore conc{conn, "{acct-7}:conc", 8, std::chrono::seconds(30)};
/// {
///   auto held = co_await sluice::redis::acquire_all(rpm, tpm.weighted(prompt_tokens), conc);
///   co_await call_llm(prompt, held.fencing_token());
/// }   // the permit of conc is released here; the start and the tokens stay spent
/// @endcode
template <sluice::detail::redis_all_budget_source... Budgets>
[[nodiscard]] asio::awaitable<all_held> acquire_all(Budgets&&... budgets) {
  static_assert(sizeof...(Budgets) > 0, "sluice::redis::acquire_all: name at least one budget");
  std::vector<sluice::detail::redis_all_budget> bs{
      sluice::detail::redis_all_access::of(std::forward<Budgets>(budgets))...};
  auto call = std::make_shared<sluice::detail::redis_all_call>(std::move(bs));
  sluice::detail::redis_all_check(call->budgets, call->keys);
  return sluice::detail::redis_without_throw_if_cancelled(
      sluice::detail::redis_all_acquire<all_held>(std::move(call)));
}

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_ACQUIRE_ALL_HPP
