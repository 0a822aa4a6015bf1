// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_SEMAPHORE_HPP
#define SLUICE_REDIS_SEMAPHORE_HPP

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/redis/connection.hpp>
#include <sluice/redis/detail/script.hpp>
#include <sluice/redis/detail/semaphore_state.hpp>

#include <sluice/detail/asio.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace sluice::detail {
// What semaphore::run(body) returns: body(fencing token) or body().
template <class F, bool = std::is_invocable_v<F&, std::int64_t>>
struct redis_run_result {
  using type = std::invoke_result_t<F&, std::int64_t>;
};
template <class F>
struct redis_run_result<F, false> {
  using type = std::invoke_result_t<F&>;
};
}  // namespace sluice::detail

namespace sluice::redis {

/// Thrown by `semaphore::run()` when the permit's lease stopped being certain
/// while the body ran (the body was cancelled and has finished).
class lease_lost : public std::runtime_error {
 public:
  lease_lost()
      : std::runtime_error(
            "sluice::redis::semaphore: the lease is no longer certain; the body was cancelled") {}
};

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
/// cut off never re-claims ahead of the queue.
///
/// Fencing tokens: every grant carries a token (`permit::fencing_token()`),
/// strictly increasing per semaphore (server-side: max(last + 1, server ms x
/// 1000), so it keeps increasing across a restart from an old snapshot as long
/// as the server's clock moved on). Pass it to the protected service and let
/// it reject a token lower than the highest it has seen: that stops a holder
/// that was paused (GC, SIGSTOP, swap) past its lease, the one case no lease
/// can prevent.
///
/// Failure semantics (each has a test):
/// - Connection lost while waiting: the wait fails with the connection's
///   error (`errc::connection_lost`, or the reconnect error such as
///   `connection_refused` while the server is down); the waiter's queue entry
///   expires after `waiter_ttl`. Nothing hangs: the subscriber's loss wakes
///   every waiter at once.
/// - Connection lost or server silent while holding: renewals reconnect at
///   their next tick (each bounded by the connection's `command_timeout`);
///   when the lease is no longer certain the permit is lost locally (above).
/// - Redis restarted or failed over (its `run_id` differs from the one
///   recorded with the keys; from an empty server, or from an old RDB
///   snapshot): no new permit is granted for one renewal interval + max(half
///   of it, 300 ms) after the change was seen (after the server's start if
///   nothing was recorded), while live holders re-claim theirs at their next
///   renewal; entries of holders that do not renew meanwhile expire then. A
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
  using held_ptr = state::held_ptr;

 public:
  /// Tuning; see `semaphore_options`.
  using options = semaphore_options;

  /// Move-only ownership of one permit; releases it on destruction.
  class permit {
   public:
    /// An empty permit that owns nothing.
    permit() noexcept = default;
    /// Takes over `o`'s ownership; `o` is left empty.
    permit(permit&& o) noexcept : st_(std::move(o.st_)), h_(std::move(o.h_)) {}
    /// Releases what this owns, then takes over `o`'s ownership.
    permit& operator=(permit&& o) noexcept {
      if (this != &o) {
        reset();
        st_ = std::move(o.st_);
        h_ = std::move(o.h_);
      }
      return *this;
    }
    ~permit() { reset(); }
    /// True while it owns a permit (also once it was lost, until `reset()`).
    explicit operator bool() const noexcept { return h_ != nullptr; }
    /// Releases the permit now (no-op when empty or lost).
    void reset() noexcept {
      if (auto h = std::exchange(h_, nullptr)) {
        st_->release(h, st_);
        st_.reset();
      }
    }
    /// The grant's fencing token: strictly increasing per semaphore (see the
    /// class comment); 0 when empty.
    [[nodiscard]] std::int64_t fencing_token() const noexcept { return h_ ? h_->token : 0; }
    /// True once the lease stopped being certain (see the class comment).
    [[nodiscard]] bool lost() const noexcept { return h_ && h_->lost; }
    /// Until when the lease is certain now (extended by each confirmed
    /// renewal); `time_point::max()` for an endless lease.
    [[nodiscard]] std::chrono::steady_clock::time_point certain_until() const noexcept {
      return h_ ? h_->certain_until : std::chrono::steady_clock::time_point{};
    }
    /// Completes when the permit is lost (at once if it is). Throws
    /// `operation_aborted` when cancelled or when the permit is released
    /// meanwhile, `std::logic_error` when empty. Resumes on the caller's
    /// executor. The permit must outlive the wait.
    [[nodiscard]] asio::awaitable<void> wait_lost() const {
      auto h = h_;
      if (!h) throw std::logic_error("sluice::redis::semaphore::permit::wait_lost: empty permit");
      while (!h->lost) {
        if (h->released) throw system_error(asio::error::operation_aborted);
        error_code ec;
        co_await h->signal.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        auto cs = co_await asio::this_coro::cancellation_state;
        if (!h->lost && cs.cancelled() != asio::cancellation_type::none)
          throw system_error(asio::error::operation_aborted);
      }
    }

   private:
    friend class semaphore;
    permit(std::shared_ptr<state> st, held_ptr h) noexcept : st_(std::move(st)), h_(std::move(h)) {
      h_->owned = true;
    }
    std::shared_ptr<state> st_;
    held_ptr h_;
  };

  /// A semaphore of `permits` permits named `name` on `conn`'s server, with
  /// leases of `lease`. Throws `std::invalid_argument` if `permits == 0` or
  /// above 2^53 (Lua numbers are doubles), `lease < 30 ms` (renewals need a
  /// few round trips of slack), `conn` is null, or `name` is empty or has a
  /// brace (it is the keys' `{hash tag}`). Sends nothing yet.
  semaphore(std::shared_ptr<connection> conn, std::string name, std::size_t permits,
            std::chrono::milliseconds lease, semaphore_options opts = {}) {
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
    stop();
    st_->sub.reset();  // closes it
  }

  /// Waits for a permit. Throws `operation_aborted` when cancelled (holding
  /// nothing), `sluice::system_error` when the connection fails (e.g.
  /// `errc::timed_out`), `server_error` if Redis rejects a script. See the
  /// class comment.
  [[nodiscard]] asio::awaitable<void> acquire() {
    return detail::redis_without_throw_if_cancelled(acquire_void(st_));
  }

  /// As `acquire()`, returning a `permit` that releases on destruction and
  /// carries the grant's fencing token.
  [[nodiscard]] asio::awaitable<permit> scoped_acquire() {
    auto st = st_;
    held_ptr h = co_await detail::redis_without_throw_if_cancelled(acquire_impl(st));
    co_return permit(st, std::move(h));
  }

  /// Runs `body()` or `body(fencing_token)` (returning `asio::awaitable<T>`)
  /// under a permit and returns its result. When the permit's lease stops being certain (see the
  /// class comment), `body` is cancelled (terminal), awaited, and `run` throws `lease_lost`, before
  /// the server can grant the permit elsewhere. Runs the body on the caller's executor.
  /// Cancellation: while waiting for the permit, as `acquire()`; while the body runs, the
  /// cancellation is passed on to it (terminal), it is awaited, and its outcome returned or thrown.
  /// The permit is released when `run` returns.
  template <class F>
  [[nodiscard]] auto run(F body) -> typename detail::redis_run_result<F>::type {
    return detail::redis_without_throw_if_cancelled(run_impl(std::move(body)));
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
          auto slot = asio::get_associated_cancellation_slot(handler);
          auto ex = st->conn->get_executor();
          auto done = [h = std::move(handler), ex](std::exception_ptr, error_code ec) mutable {
            detail::post_completion(std::move(h), ex, ec);
          };
          asio::co_spawn(ex, acquire_ec(st),
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
    reply r = co_await eval_or_drop(st, id, st->acquire_args(id, "try"));
    if (r.elements.at(0).integer != 1) co_return false;
    add_held(st, id, r.elements.at(2).integer, sent);
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
    co_return static_cast<std::size_t>((co_await status(st)).elements.at(0).integer);
  }

  /// Waiters across the fleet now (one round trip).
  [[nodiscard]] asio::awaitable<std::size_t> waiters() {
    auto st = st_;
    co_return static_cast<std::size_t>((co_await status(st)).elements.at(1).integer);
  }

  /// Permits this process holds now (a lost permit no longer counts).
  [[nodiscard]] std::size_t held() const noexcept { return st_->held.size(); }
  /// acquire() calls of this process waiting now.
  [[nodiscard]] std::size_t local_waiters() const noexcept { return st_->waiters.size(); }
  /// Permits lost so far (once per permit; see the class comment); 0 in a
  /// healthy fleet.
  [[nodiscard]] std::size_t lost() const noexcept { return st_->lost; }
  /// The Redis keys and channel prefix: `sluice:sem:{<name>}:` followed by
  /// `holders`, `queue`, `alive`, `ticket`, `meta`, `fence`, `released`.
  [[nodiscard]] std::string key_prefix() const { return st_->prefix; }

  /// Stops the renewal loop and waits for it, releases the permits still held
  /// and closes the subscriber connection. Runs to the end even when the
  /// caller was cancelled.
  [[nodiscard]] asio::awaitable<void> close() {
    auto st = st_;
    stop();
    const bool was = co_await asio::this_coro::throw_if_cancelled();
    co_await asio::this_coro::throw_if_cancelled(false);
    if (st->renewing) {
      auto token = asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable);
      auto init = [p = st.get()](auto&& handler) {
        p->renewal_done.emplace_back(std::forward<decltype(handler)>(handler),
                                     p->conn->get_executor());
      };
      auto op = asio::async_initiate<decltype(token), void()>(init, token);
      co_await std::move(op);
    }
    if (auto sub = std::exchange(st->sub, nullptr)) co_await sub->close();
    co_await asio::this_coro::throw_if_cancelled(was);
  }

 private:
  static asio::awaitable<reply> status(std::shared_ptr<state> st) {
    std::vector<std::string> a{std::to_string(st->permits)};
    co_return co_await detail::redis_eval(*st->conn, st->status, st->keys, std::move(a),
                                          detail::redis_cancel::follow);
  }

  // The acquire script for `id`, following the caller's cancellation; a
  // cancelled call drops `id` behind it (whatever the script did).
  static asio::awaitable<reply> eval_or_drop(std::shared_ptr<state> st, std::string id,
                                             std::vector<std::string> a) {
    try {
      co_return co_await detail::redis_eval(*st->conn, st->acquire, st->keys, std::move(a),
                                            detail::redis_cancel::follow);
    } catch (const system_error& e) {
      if (e.code() == asio::error::operation_aborted) st->send_drop(id, st);
      throw;
    }
  }

  static held_ptr add_held(const std::shared_ptr<state>& st, std::string id, std::int64_t token,
                           detail::redis_clock::time_point sent) {
    auto h = std::make_shared<detail::redis_sem_held>(
        std::move(id), token, detail::redis_add_sat(sent, st->lease - st->margin),
        st->conn->get_executor());
    st->held.push_back(h);
    detail::redis_sem_start_renewal(st);
    st->arm_watchdog(st);
    return h;
  }

  void stop() noexcept {
    auto& st = *st_;
    if (st.stopped) return;
    st.stopped = true;
    st.renew_timer.cancel();
    st.watchdog.cancel();
    while (!st.held.empty()) st.release(st.held.back(), st_);
    st.wake(st.waiters.size());
    if (st.sub) {
      st.sub->on_message(nullptr);
      st.sub->on_lost(nullptr);
    }
  }

  static asio::awaitable<void> acquire_void(std::shared_ptr<state> st) {
    co_await acquire_impl(st);
  }

  static asio::awaitable<error_code> acquire_ec(std::shared_ptr<state> st) {
    try {
      co_await detail::redis_without_throw_if_cancelled(acquire_impl(st));
    } catch (const system_error& e) {
      co_return e.code();
    } catch (const server_error&) {
      co_return make_error_code(errc::protocol_error);
    }
    co_return error_code{};
  }

  template <class F>
  auto run_impl(F body) -> typename detail::redis_run_result<F>::type {
    using awaitable_t = typename detail::redis_run_result<F>::type;
    using value_t = typename awaitable_t::value_type;
    auto st = st_;
    permit p = co_await scoped_acquire();
    auto h = p.h_;
    auto ex = co_await asio::this_coro::executor;
    auto cs = co_await asio::this_coro::cancellation_state;
    asio::cancellation_signal stop_body;
    asio::steady_timer wake(ex, detail::redis_clock::time_point::max());
    bool done = false;
    bool stopping = false;
    std::exception_ptr error;
    std::optional<std::conditional_t<std::is_void_v<value_t>, int, value_t>> value;
    h->on_lost = [&wake] {
      wake.cancel();
    };
    auto on_done = [&](std::exception_ptr e, auto... v) {
      done = true;
      error = e;
      if constexpr (sizeof...(v) == 1) {
        if (!e) value.emplace(std::move(v)...);
      }
      wake.cancel();
    };
    auto start = [&] {
      if constexpr (std::is_invocable_v<F&, std::int64_t>) {
        return body(h->token);
      } else {
        return body();
      }
    };
    asio::co_spawn(ex, start(), asio::bind_cancellation_slot(stop_body.slot(), on_done));
    while (!done) {
      if (!stopping && (h->lost || cs.cancelled() != asio::cancellation_type::none)) {
        stopping = true;
        stop_body.emit(asio::cancellation_type::terminal);
        continue;
      }
      error_code ec;
      if (stopping) {
        co_await wake.async_wait(asio::bind_cancellation_slot(
            asio::cancellation_slot(), asio::redirect_error(asio::use_awaitable, ec)));
      } else {
        co_await wake.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      }
    }
    h->on_lost = nullptr;
    if (h->lost && stopping) throw lease_lost();
    if (error) std::rethrow_exception(error);
    if constexpr (!std::is_void_v<value_t>) co_return std::move(*value);
  }

  static asio::awaitable<held_ptr> acquire_impl(std::shared_ptr<state> st) {
    auto cs = co_await asio::this_coro::cancellation_state;
    auto cancelled = [&] {
      return cs.cancelled() != asio::cancellation_type::none;
    };
    if (cancelled() || st->stopped) throw system_error(asio::error::operation_aborted);
    state::waiter w{detail::redis_unique_id(), asio::steady_timer(st->conn->get_executor())};
    st->waiters.push_back(&w);
    auto it = std::prev(st->waiters.end());
    struct unlink {
      state& s;
      std::list<state::waiter*>::iterator it;
      ~unlink() { s.waiters.erase(it); }
    } guard{*st, it};
    for (;;) {
      w.kick = false;
      const auto sent = detail::redis_clock::now();
      reply r = co_await eval_or_drop(st, w.id, st->acquire_args(w.id, "wait"));
      if (r.elements.at(0).integer == 1) {
        if (cancelled() || st->stopped) {  // granted, but the caller is gone: pass it on
          st->send_drop(w.id, st);
          throw system_error(asio::error::operation_aborted);
        }
        co_return add_held(st, w.id, r.elements.at(2).integer, sent);
      }
      if (!cancelled() && !st->stopped) {
        if (!st->subscribed && !st->subscribing) co_await detail::redis_sem_subscribe(st);
        if (!w.kick && !cancelled() && !st->stopped) {
          w.timer.expires_after(st->poll);
          error_code ec;
          auto token = asio::redirect_error(asio::use_awaitable, ec);
          co_await w.timer.async_wait(token);
        }
      }
      if (cancelled() || st->stopped) {
        std::vector<std::string> k{st->keys[0], st->keys[1], st->keys[2]};
        std::vector<std::string> a{w.id, st->channel};
        co_await detail::redis_eval(*st->conn, st->drop, std::move(k), std::move(a));
        throw system_error(asio::error::operation_aborted);
      }
    }
  }

  std::shared_ptr<state> st_;
};

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_SEMAPHORE_HPP
