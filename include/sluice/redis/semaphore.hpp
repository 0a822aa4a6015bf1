// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_SEMAPHORE_HPP
#define SLUICE_REDIS_SEMAPHORE_HPP

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/redis/connection.hpp>
#include <sluice/redis/detail/script.hpp>
#include <sluice/redis/detail/semaphore_loops.hpp>
#include <sluice/redis/detail/semaphore_ops.hpp>
#include <sluice/redis/detail/semaphore_state.hpp>
#include <sluice/redis/semaphore_permit.hpp>
#include <sluice/stats.hpp>

#include <sluice/detail/asio.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

namespace sluice::detail {
struct redis_all_access;
}  // namespace sluice::detail

namespace sluice::redis {

/// Tuning of a `redis::semaphore`; zero means the default described there.
struct semaphore_options {
  /// How often a waiter asks again when no release was announced.
  std::chrono::milliseconds poll_interval{0};
  /// How long a waiter that stopped polling keeps its place in line.
  std::chrono::milliseconds waiter_ttl{0};
};

/// A counting semaphore shared by every process that uses the same Redis
/// server and `name`: at most `permits` holders at once across the fleet.
///
/// The members are those of `sluice::semaphore`; the ones that must ask the
/// server return awaitables (`try_acquire()`, `value()`, `waiters()`), because
/// a cluster-wide answer needs a round trip. Every decision is one Lua script
/// run atomically by Redis (loaded once with `SCRIPT LOAD`, called with
/// `EVALSHA`, loaded again after `NOSCRIPT`), using the server's clock
/// (`TIME`), so the clients' clocks do not matter.
///
/// Fairness: each waiter draws a ticket (`INCR`) on its first attempt and
/// keeps it while it waits. A waiter is granted only while fewer older waiters
/// than free permits are ahead of it, so waiters across processes are served
/// oldest first; overtaking happens only among waiters that are all eligible
/// at that moment. `try_acquire()` never barges past a waiter.
///
/// Waiting: a release is announced on a pub/sub channel (on a second
/// connection, opened by the semaphore with `connect_again()` on the first
/// wait); each announcement wakes the oldest `permits` waiters of each process.
/// A lease that expires announces nothing, so every waiter also polls every
/// `poll_interval` (default lease / 10, clamped to 10 ms .. 1 s). A waiter that
/// stops polling for `waiter_ttl` (default max(10 x poll, 2 s)) is dropped
/// from the queue, so a dead process never blocks the line.
///
/// Leases: a permit is granted with a lease; while this process holds any
/// permit, one renewal loop (owned by the semaphore, a timer every
/// min(lease / 3, 1 s)) extends all of them in one script call. A holder that
/// dies without releasing loses its permit when its lease runs out.
/// `release()` and the destructor of `permit` send the release at once
/// (pipelined; they do not wait for the reply).
///
/// Lease safety: a permit is certain only until the local send time of its
/// grant or of its last confirmed renewal + lease - a drift margin (lease / 50
/// + 5 ms). Past that moment it is lost *here first*, before the server can
/// grant it elsewhere: it leaves `held()`, `lost()` counts it once, the
/// permit's `lost()` turns true and its `wait_lost()` completes, and `run()`
/// cancels its body and throws `lease_lost`. A renewal that finds the entry
/// gone (outside a restart's grace) loses it the same way: a holder that was
/// cut off never re-claims ahead of the queue. Through Sentinel a permit is
/// also certain no longer than the last check in which the sentinels'
/// majority named its node primary + the restart grace (see
/// `connect_sentinel()`). Certainty is not a guarantee across a failover: a
/// promoted replica that lacks the permit (replica lag) grants it again after
/// its grace, which a holder paused (GC, SIGSTOP) through that time cannot
/// see; the fencing token is the protection there.
///
/// Fencing tokens: every grant carries a token (`permit::fencing_token()`),
/// strictly increasing per semaphore (server-side: max(last + 1, server ms x
/// 1000, and every acquire and renewal first raises `last` to the highest
/// token its process was granted), so it keeps increasing across a restart
/// from an old snapshot or a failover to a lagging replica whose clock is
/// behind: the live clients seed the new node within its grace, before it
/// grants). Pass it to the protected service and let
/// it reject a token lower than the highest it has seen: that stops a holder
/// that was paused (GC, SIGSTOP, swap) past its lease, the one case no lease
/// can prevent.
///
/// Failure semantics (each has a test):
/// - Connection lost while waiting: the wait fails with the connection's
///   error (`errc::connection_lost`, or the reconnect error such as
///   `connection_refused` while the server is down, `errc::timed_out` for a
///   silent one); the waiter's id is dropped from the queue by a script sent
///   on the next socket (if that fails too, its entry expires after
///   `waiter_ttl`). Nothing hangs: the subscriber's loss wakes every waiter
///   at once.
/// - Connection lost or server silent while holding: renewals reconnect at
///   their next tick (each bounded by the connection's `command_timeout`);
///   when the lease is no longer certain the permit is lost locally (above).
/// - Redis restarted or failed over (its `run_id` differs from the one
///   recorded with the keys; from an empty server, or from an old RDB
///   snapshot): no new permit is granted for one renewal interval + max(half
///   of it, 300 ms) after the change was seen (after the server's start if
///   nothing was recorded), while live holders re-claim theirs at their next
///   renewal; entries of holders that do not renew meanwhile expire then, and
///   so do those of waiters that do not ask again (the old node's waiters,
///   whose clean-up was lost with it). A
///   fresh server delays the first grants in the same way; a lease of an hour
///   still waits only about 1.8 s.
/// - `acquire` whose reply is lost with the connection may leave a permit
///   granted on the server that nobody holds: it returns after its lease.
///
/// Cancellation (terminal, partial, total): a waiting `acquire` is cancelled
/// at once, also in the middle of a round trip (its id is then dropped from
/// the queue and the holders by a script pipelined behind it, not awaited; it
/// throws `operation_aborted`, holding nothing); if the grant raced the
/// cancellation, the permit is released again. A caller cancelled before it
/// called throws without contacting the server.
///
/// Lifetime: the semaphore must outlive its permits and acquire calls.
/// `close()` stops the renewal loop and waits for it, releases the permits
/// still held, and closes the subscriber connection; the destructor does the
/// same without waiting (the loop ends on the next turn of the loop, touching
/// only shared internal state). Loop-affine: use it from the connection's
/// executor.
///
/// @code
/// auto conn = co_await sluice::redis::connect(ex, "127.0.0.1", 6379);
/// sluice::redis::semaphore cap{conn, "places-api", 5, std::chrono::seconds(30)};
/// {
///   auto permit = co_await cap.scoped_acquire();   // at most 5 across the fleet
///   co_await call_places_api(permit.fencing_token());
/// }                                                 // released here
/// // or: the body is cancelled when the lease is no longer certain
/// co_await cap.run([&]() -> asio::awaitable<void> { co_await call_places_api(0); });
/// co_await cap.close();
/// @endcode
class semaphore {
  using state = detail::redis_sem_state;

 public:
  /// Tuning; see `semaphore_options`.
  using options = semaphore_options;

  /// Move-only ownership of one permit; releases it on destruction. See
  /// `semaphore_permit`.
  using permit = semaphore_permit;

  /// A semaphore of `permits` permits named `name` on `conn`'s server, with
  /// leases of `lease`. Throws `std::invalid_argument` if `permits == 0` or
  /// above 2^53 (Lua numbers are doubles), `lease < 30 ms` (renewals need a
  /// few round trips of slack), `conn` is null, or `name` is empty or has a
  /// brace other than one leading hash tag (the name is the keys' `{hash
  /// tag}`, or carries its own: `"{account}:conc"`, so that limits of one
  /// account share a slot for `redis::acquire_all`). Sends nothing yet. `lease` takes
  /// any duration, saturated (then counted in whole milliseconds).
  template <class Rep, class Period>
  semaphore(std::shared_ptr<connection> conn, std::string name, std::size_t permits,
            std::chrono::duration<Rep, Period> lease_for, semaphore_options opts = {}) {
    const auto saturated = sluice::detail::saturate(lease_for);
    const auto lease =  // forever stays forever: milliseconds::max() is the endless lease
        saturated == decltype(saturated)::max()
            ? std::chrono::milliseconds::max()
            : std::chrono::duration_cast<std::chrono::milliseconds>(saturated);
    if (!conn) throw std::invalid_argument("sluice::redis::semaphore: null connection");
    if (permits == 0) throw std::invalid_argument("sluice::redis::semaphore: permits == 0");
    detail::redis_check_exact(permits, "sluice::redis::semaphore");
    detail::redis_check_name(name, "sluice::redis::semaphore");
    if (lease < std::chrono::milliseconds(30))
      throw std::invalid_argument("sluice::redis::semaphore: lease shorter than 30 ms");
    auto poll = opts.poll_interval.count() > 0
                    ? opts.poll_interval
                    : std::clamp(lease / 10, std::chrono::milliseconds(10),
                                 std::chrono::milliseconds(1000));
    auto ttl = opts.waiter_ttl.count() > 0 ? opts.waiter_ttl
                                           : std::max(poll * 10, std::chrono::milliseconds(2000));
    st_ = std::make_shared<state>(std::move(conn), name, permits, lease, poll, ttl);
  }
  semaphore(const semaphore&) = delete;
  semaphore& operator=(const semaphore&) = delete;

  /// Stops renewing, releases the permits still held (pipelined) and drops the
  /// subscriber connection, without waiting; waiting acquires end with
  /// `operation_aborted`. Prefer `co_await close()`.
  ~semaphore() {
    detail::redis_sem_stop(st_);
    st_->sub.reset();  // closes it
  }

  /// Waits for a permit. Throws `operation_aborted` when cancelled (holding
  /// nothing), `sluice::system_error` when the connection fails (e.g.
  /// `errc::timed_out`), `server_error` if Redis rejects a script. See the
  /// class comment.
  [[nodiscard]] asio::awaitable<void> acquire() {
    return detail::redis_without_throw_if_cancelled(detail::redis_sem_acquire_void(st_));
  }

  /// As `acquire()`, returning a `permit` that releases on destruction and
  /// carries the grant's fencing token.
  [[nodiscard]] asio::awaitable<permit> scoped_acquire() {
    return detail::redis_sem_scoped_acquire(st_);
  }

  /// Runs `body()` or `body(fencing_token)` (returning `asio::awaitable<T>`)
  /// under a permit and returns its result. When the permit's lease stops being certain (see the
  /// class comment), `body` is cancelled (terminal), awaited, and `run` throws `lease_lost`, before
  /// the server can grant the permit elsewhere. Not across a failover: a promoted replica that
  /// lacks the permit (replica lag) may grant it again after its grace while this process was
  /// paused or cut off; pass the fencing token to the service, which is the protection there.
  /// Runs the body on the caller's executor.
  /// Cancellation: while waiting for the permit, as `acquire()`; while the body runs, the
  /// cancellation is passed on to it (terminal), it is awaited, and its outcome returned or thrown.
  /// The permit is released when `run` returns.
  template <class F>
  [[nodiscard]] auto run(F body) -> typename detail::redis_run_result<F>::type {
    return detail::redis_without_throw_if_cancelled(detail::redis_sem_run(st_, std::move(body)));
  }

  /// Waits for a permit; any completion token, signature
  /// `void(sluice::error_code)`. Errors: `operation_aborted` (cancelled or
  /// the semaphore closed), the connection's error, or
  /// `errc::protocol_error` for a script error reply. Completes through a
  /// post to the handler's executor (else the connection's).
  template <asio::completion_token_for<void(error_code)> CompletionToken>
  auto async_acquire(CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(error_code)>(
        [st = st_](auto handler) {
          auto ex = st->conn->get_executor();
          if (detail::refuse_cancelled(handler, ex)) return;  // cancelled before it called
          auto slot = asio::get_associated_cancellation_slot(handler);
          auto done = [h = std::move(handler), ex](std::exception_ptr, error_code ec) mutable {
            detail::post_completion(std::move(h), ex, ec);
          };
          asio::co_spawn(ex, detail::redis_sem_acquire_ec(st),
                         detail::redis_slot_handler<decltype(done)>{slot, std::move(done)});
        },
        token);
  }

  /// Takes a permit if one is free and nobody waits anywhere (no barging);
  /// one round trip, never waits in line. Throws as `acquire()`.
  [[nodiscard]] asio::awaitable<bool> try_acquire() {
    auto st = st_;
    std::string id = detail::redis_unique_id();
    const auto sent = detail::redis_clock::now();
    reply r = co_await detail::redis_sem_eval_or_drop(st, id, st->acquire_args(id, "try"));
    if (r.elements.at(0).integer != 1) co_return false;
    if (!detail::redis_sem_add_held(st, id, r.elements.at(2).integer, sent)) co_return false;
    ++st->stats.acquired;
    st->stats.record_wait(detail::redis_clock::now() - sent);
    co_return true;
  }

  /// Returns a permit this process took with `acquire()`/`try_acquire()`:
  /// sends the release at once (in order with later calls on the connection)
  /// and wakes the waiters of every process through pub/sub. A permit that
  /// was lost meanwhile is only forgotten. Throws `std::logic_error` if this
  /// process holds no such permit.
  void release() {
    if (st_->lost_unowned > 0) {
      --st_->lost_unowned;
      return;
    }
    for (auto it = st_->held.rbegin(); it != st_->held.rend(); ++it) {
      if (!(*it)->owned) {
        st_->release(*it, st_);
        return;
      }
    }
    throw std::logic_error("sluice::redis::semaphore::release: this process holds no permit");
  }

  /// Free permits across the fleet now (one round trip).
  [[nodiscard]] asio::awaitable<std::size_t> value() {
    auto st = st_;
    co_return static_cast<std::size_t>(
        (co_await detail::redis_sem_status(st)).elements.at(0).integer);
  }

  /// Waiters across the fleet now (one round trip).
  [[nodiscard]] asio::awaitable<std::size_t> waiters() {
    auto st = st_;
    co_return static_cast<std::size_t>(
        (co_await detail::redis_sem_status(st)).elements.at(1).integer);
  }

  /// Permits this process holds now (a lost permit no longer counts).
  [[nodiscard]] std::size_t held() const noexcept { return st_->held.size(); }
  /// acquire() calls of this process waiting now.
  [[nodiscard]] std::size_t local_waiters() const noexcept { return st_->waiters.size(); }
  /// Permits lost so far (once per permit; see the class comment); 0 in a
  /// healthy fleet.
  [[nodiscard]] std::size_t lost() const noexcept { return st_->lost; }
  /// What this client has done and is doing (see `sluice::stats`), with no
  /// round trip: this semaphore object's view, not the fleet's. `acquired`
  /// counts its grants (`try_acquire()` when it grants); `wait` times every
  /// grant from the call, its round trips included (so no grant waited 0);
  /// `hold` times every permit from its grant to its release or loss (bare
  /// `acquire()`/`release()` pairs too); `cancelled` counts waits that ended
  /// in `operation_aborted` (also when `close()` ended them); `waiting` is
  /// `local_waiters()`, `in_use` is `held()`, `limit` the permits;
  /// `throttled` stays 0. A wait that failed with the connection counts in
  /// none of them. The fleet's view is `co_await value()` and `waiters()`
  /// (one round trip each). O(buckets), allocates nothing; read it on the
  /// connection's executor.
  [[nodiscard]] sluice::stats stats() const noexcept {
    return st_->stats.read(st_->waiters.size(), st_->held.size(), st_->permits);
  }
  /// The Redis keys and channel prefix: `sluice:sem:{<name>}:` (or
  /// `sluice:sem:<name>:` for a name with its own hash tag) followed by
  /// `holders`, `queue`, `alive`, `ticket`, `meta`, `fence`, `released`.
  [[nodiscard]] std::string key_prefix() const { return st_->prefix; }

  /// Stops the renewal loop and waits for it, releases the permits still held
  /// and closes the subscriber connection. Runs to the end even when the
  /// caller was cancelled.
  [[nodiscard]] asio::awaitable<void> close() { return detail::redis_sem_close(st_); }

 private:
  friend struct detail::redis_all_access;
  std::shared_ptr<state> st_;
};

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_SEMAPHORE_HPP
