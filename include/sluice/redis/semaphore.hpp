// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_SEMAPHORE_HPP
#define SLUICE_REDIS_SEMAPHORE_HPP

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/redis_script.hpp>
#include <sluice/redis/connection.hpp>

#include <sluice/detail/asio.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <list>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace sluice::detail {

// The Lua scripts of redis::semaphore. Keys: holders (zset id -> lease expiry,
// server ms), queue (zset waiter id -> ticket), alive (zset waiter id ->
// expiry of a waiter that stopped polling), ticket (counter), boot (the
// server's start time in ms, to hold back new grants for a lease after a
// restart so that live holders can re-claim their permits first).
inline constexpr const char* redis_sem_acquire_lua = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local permits, id, lease, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for i = 1, #dead do redis.call('ZREM', KEYS[2], dead[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZSCORE', KEYS[1], id) then
  redis.call('ZADD', KEYS[1], now + lease, id)
  return {1, 0}
end
local boot = tonumber(redis.call('GET', KEYS[5]))
if not boot then
  local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)'))
  boot = now - up * 1000
  redis.call('SET', KEYS[5], boot)
end
local settled = now >= boot + lease + 1000
local free = permits - redis.call('ZCARD', KEYS[1])
if ARGV[5] == 'try' then
  if settled and free > 0 and redis.call('ZCARD', KEYS[2]) == 0 then
    redis.call('ZADD', KEYS[1], now + lease, id)
    return {1, 0}
  end
  return {0, -1}
end
if not redis.call('ZSCORE', KEYS[2], id) then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), id)
end
redis.call('ZADD', KEYS[3], now + ttl, id)
local rank = redis.call('ZRANK', KEYS[2], id)
if settled and rank < free then
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZADD', KEYS[1], now + lease, id)
  return {1, rank}
end
return {0, rank}
)lua";

// KEYS: holders. ARGV: permits, lease, ids... Returns the ids it could
// neither renew nor re-claim (lost).
inline constexpr const char* redis_sem_renew_lua = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local lost = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('ZSCORE', KEYS[1], id) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), id)
  else
    lost[#lost + 1] = id
  end
end
return lost
)lua";

// KEYS: holders. ARGV: id, channel.
inline constexpr const char* redis_sem_release_lua = R"lua(
local n = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], 'release')
return n
)lua";

// KEYS: queue, alive. ARGV: id, channel. A waiter that gives up.
inline constexpr const char* redis_sem_leave_lua = R"lua(
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[2], 'leave')
return 0
)lua";

// KEYS: holders, queue, alive. ARGV: permits. Returns {free, waiting}.
inline constexpr const char* redis_sem_status_lua = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for i = 1, #dead do redis.call('ZREM', KEYS[2], dead[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local free = tonumber(ARGV[1]) - redis.call('ZCARD', KEYS[1])
if free < 0 then free = 0 end
return {free, redis.call('ZCARD', KEYS[2])}
)lua";

// The state of a redis::semaphore, shared with its renewal loop and its
// subscriber callbacks. Loop-affine.
struct redis_sem_state {
  // One acquire() waiting in this process, in the frame of its coroutine.
  struct waiter {
    std::string id;
    asio::steady_timer timer;
    bool kick = false;  // a release was announced while it was not sleeping
  };

  std::shared_ptr<redis::connection> conn;
  std::shared_ptr<redis::connection> sub;  // SUBSCRIBEd to channel
  std::string holders, queue, alive, ticket, boot, channel;
  std::size_t permits;
  std::chrono::milliseconds lease, poll, waiter_ttl;
  redis_script acquire{redis_sem_acquire_lua, {}}, renew{redis_sem_renew_lua, {}},
      release{redis_sem_release_lua, {}}, leave{redis_sem_leave_lua, {}},
      status{redis_sem_status_lua, {}};
  std::vector<std::string> held;  // permit ids this process holds
  std::list<waiter*> waiters;     // in arrival (= ticket) order
  bool stopped = false;
  bool subscribed = false;
  bool subscribing = false;
  bool renewing = false;
  asio::steady_timer renew_timer;
  std::vector<erased_handler<>> renewal_done;  // close() waiting for the loop
  std::size_t lost = 0;
  std::size_t failed_renewals = 0;
  std::size_t failed_releases = 0;

  redis_sem_state(std::shared_ptr<redis::connection> c, const std::string& name, std::size_t n,
                  std::chrono::milliseconds l, std::chrono::milliseconds p,
                  std::chrono::milliseconds ttl)
      : conn(std::move(c)),
        permits(n),
        lease(l),
        poll(p),
        waiter_ttl(ttl),
        renew_timer(conn->get_executor()) {
    const std::string base = "sluice:sem:{" + name + "}:";
    holders = base + "holders";
    queue = base + "queue";
    alive = base + "alive";
    ticket = base + "ticket";
    boot = base + "boot";
    channel = base + "released";
  }

  // Wakes the first `n` local waiters (only they can be next in line: local
  // order is ticket order).
  void wake(std::size_t n) {
    for (waiter* w : waiters) {
      if (n-- == 0) break;
      w->kick = true;
      w->timer.cancel();
    }
  }

  void send_release(const std::string& id, const std::shared_ptr<redis_sem_state>& self) {
    redis_eval_detached_reply(*conn, release, {holders}, {id, channel}, [self](bool ok) {
      if (!ok) ++self->failed_releases;
    });
  }
};

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
/// permit, one renewal loop (owned by the semaphore, a timer every lease / 3)
/// extends all of them in one script call. A holder that dies without
/// releasing loses its permit when its lease runs out. `release()` and the
/// destructor of `permit` send the release at once (pipelined; they do not
/// wait for the reply).
///
/// Failure semantics (each has a test):
/// - Connection lost while waiting: the wait fails with the connection's
///   error (`errc::connection_lost`, or the reconnect error such as
///   `connection_refused` while the server is down); the waiter's queue entry
///   expires after `waiter_ttl`. Nothing hangs: the subscriber's loss wakes
///   every waiter at once.
/// - Connection lost while holding: the holder keeps running (Redis cannot
///   revoke work). Renewals reconnect at their next tick; if the server is
///   unreachable for longer than the lease, the permit expires and may be
///   granted to another process: the holder counts it in `lost()`.
/// - Redis restarted (without persistence: every key gone): for one lease
///   (plus one second of clock granularity) after the server starts, no new
///   permit is granted, while live holders re-claim theirs at their next
///   renewal. A permit can thus be granted twice only when its holder failed
///   to renew for a whole lease: the same bound as a holder cut off by the
///   network. A fresh server delays the first grants in the same way.
/// - `acquire` whose reply is lost with the connection may leave a permit
///   granted on the server that nobody holds: it returns after its lease.
///
/// Cancellation (terminal, partial, total): a waiting `acquire` is cancelled
/// at once (its queue entry is removed with one uncancellable round trip, then
/// it throws `operation_aborted`, holding nothing); if the grant raced the
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
///   co_await call_places_api();
/// }                                                 // released here
/// co_await cap.close();
/// @endcode
class semaphore {
 public:
  /// Tuning; see `semaphore_options`.
  using options = semaphore_options;

  /// Move-only ownership of one permit; releases it on destruction.
  class permit {
   public:
    /// An empty permit that owns nothing.
    permit() noexcept = default;
    /// Takes over `o`'s ownership; `o` is left empty.
    permit(permit&& o) noexcept : sem_(std::exchange(o.sem_, nullptr)) {}
    /// Releases what this owns, then takes over `o`'s ownership.
    permit& operator=(permit&& o) noexcept {
      if (this != &o) {
        reset();
        sem_ = std::exchange(o.sem_, nullptr);
      }
      return *this;
    }
    ~permit() { reset(); }
    /// True while it owns a permit.
    explicit operator bool() const noexcept { return sem_ != nullptr; }
    /// Releases the permit now (no-op when empty).
    void reset() noexcept {
      if (auto* s = std::exchange(sem_, nullptr)) s->release_nothrow();
    }

   private:
    friend class semaphore;
    explicit permit(semaphore& s) noexcept : sem_(&s) {}
    semaphore* sem_ = nullptr;
  };

  /// A semaphore of `permits` permits named `name` on `conn`'s server, with
  /// leases of `lease`. Throws `std::invalid_argument` if `permits == 0`,
  /// `lease < 30 ms` (renewals every lease / 3 need a few round trips of
  /// slack), or `conn` is null. Sends nothing yet.
  semaphore(std::shared_ptr<connection> conn, std::string name, std::size_t permits,
            std::chrono::milliseconds lease, semaphore_options opts = {}) {
    if (!conn) throw std::invalid_argument("sluice::redis::semaphore: null connection");
    if (permits == 0) throw std::invalid_argument("sluice::redis::semaphore: permits == 0");
    if (lease < std::chrono::milliseconds(30))
      throw std::invalid_argument("sluice::redis::semaphore: lease shorter than 30 ms");
    auto poll = opts.poll_interval.count() > 0
                    ? opts.poll_interval
                    : std::clamp(lease / 10, std::chrono::milliseconds(10),
                                 std::chrono::milliseconds(1000));
    auto ttl = opts.waiter_ttl.count() > 0 ? opts.waiter_ttl
                                           : std::max(poll * 10, std::chrono::milliseconds(2000));
    st_ =
        std::make_shared<detail::redis_sem_state>(std::move(conn), name, permits, lease, poll, ttl);
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
  /// nothing), `sluice::system_error` when the connection fails,
  /// `server_error` if Redis rejects a script. See the class comment.
  [[nodiscard]] asio::awaitable<void> acquire() {
    return detail::redis_without_throw_if_cancelled(acquire_impl(st_));
  }

  /// As `acquire()`, returning a `permit` that releases on destruction.
  [[nodiscard]] asio::awaitable<permit> scoped_acquire() {
    co_await acquire();
    co_return permit(*this);
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
    redis::reply r =
        co_await detail::redis_eval(*st->conn, st->acquire, keys(*st), args(*st, id, "try"));
    if (r.elements.at(0).integer != 1) co_return false;
    st->held.push_back(id);
    start_renewal(st);
    co_return true;
  }

  /// Returns a permit this process holds: sends the release at once (in order
  /// with later calls on the connection) and wakes the waiters of every
  /// process through pub/sub. Throws `std::logic_error` if this process holds
  /// no permit of this semaphore.
  void release() {
    if (st_->held.empty())
      throw std::logic_error("sluice::redis::semaphore::release: this process holds no permit");
    release_nothrow();
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

  /// Permits this process holds now.
  [[nodiscard]] std::size_t held() const noexcept { return st_->held.size(); }
  /// acquire() calls of this process waiting now.
  [[nodiscard]] std::size_t local_waiters() const noexcept { return st_->waiters.size(); }
  /// Permits a renewal found expired and taken by others (see the class
  /// comment); 0 in a healthy fleet.
  [[nodiscard]] std::size_t lost() const noexcept { return st_->lost; }
  /// The Redis keys and channel prefix: `sluice:sem:{<name>}:` followed by
  /// `holders`, `queue`, `alive`, `ticket`, `boot`, `released`.
  [[nodiscard]] std::string key_prefix() const {
    return st_->holders.substr(0, st_->holders.size() - 7);
  }

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
  using state = detail::redis_sem_state;

  static asio::awaitable<reply> status(std::shared_ptr<state> st) {
    std::vector<std::string> k{st->holders, st->queue, st->alive};
    std::vector<std::string> a{std::to_string(st->permits)};
    co_return co_await detail::redis_eval(*st->conn, st->status, std::move(k), std::move(a));
  }

  static std::vector<std::string> keys(const state& st) {
    return {st.holders, st.queue, st.alive, st.ticket, st.boot};
  }
  static std::vector<std::string> args(const state& st, const std::string& id, const char* mode) {
    return {std::to_string(st.permits), id, std::to_string(st.lease.count()),
            std::to_string(st.waiter_ttl.count()), mode};
  }

  void release_nothrow() noexcept {
    try {
      if (st_->held.empty()) return;
      std::string id = std::move(st_->held.back());
      st_->held.pop_back();
      st_->send_release(id, st_);
    } catch (...) {
      ++st_->failed_releases;  // the lease returns it
    }
  }

  void stop() noexcept {
    auto& st = *st_;
    if (st.stopped) return;
    st.stopped = true;
    st.renew_timer.cancel();
    while (!st.held.empty()) release_nothrow();
    st.wake(st.waiters.size());
    if (st.sub) {
      st.sub->on_message(nullptr);
      st.sub->on_lost(nullptr);
    }
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

  static void start_renewal(const std::shared_ptr<state>& st) {
    if (st->renewing || st->stopped) return;
    st->renewing = true;
    asio::co_spawn(st->conn->get_executor(), renew_loop(st), [st](std::exception_ptr) {
      st->renewing = false;
      auto done = std::move(st->renewal_done);
      st->renewal_done.clear();
      for (auto& d : done) d.complete();
      if (!st->stopped && !st->held.empty()) start_renewal(st);
    });
  }

  static asio::awaitable<void> renew_loop(std::shared_ptr<state> st) {
    while (!st->stopped && !st->held.empty()) {
      st->renew_timer.expires_after(st->lease / 3);
      error_code ec;
      auto token = asio::redirect_error(asio::use_awaitable, ec);
      co_await st->renew_timer.async_wait(token);
      if (st->stopped || st->held.empty()) break;
      std::vector<std::string> a{std::to_string(st->permits), std::to_string(st->lease.count())};
      a.insert(a.end(), st->held.begin(), st->held.end());
      try {
        std::vector<std::string> k{st->holders};
        redis::reply r =
            co_await detail::redis_eval(*st->conn, st->renew, std::move(k), std::move(a));
        st->lost += r.elements.size();
      } catch (...) {
        ++st->failed_renewals;  // retried at the next tick (the call reconnects)
      }
    }
  }

  // Subscribes the second connection to the release channel (once; again
  // after its loss). Failures only mean polling.
  static asio::awaitable<void> subscribe(std::shared_ptr<state> st) {
    if (st->subscribed || st->subscribing || st->stopped) co_return;
    st->subscribing = true;
    try {
      if (!st->sub) {
        auto sub = co_await st->conn->connect_again();
        if (st->stopped) {
          co_await sub->close();
          st->subscribing = false;
          co_return;
        }
        std::weak_ptr<state> weak = st;
        sub->on_message([weak](const reply&) {
          if (auto s = weak.lock()) s->wake(s->permits);
        });
        sub->on_lost([weak] {
          if (auto s = weak.lock()) {
            s->subscribed = false;
            s->wake(s->waiters.size());  // let every waiter see the failure now
          }
        });
        st->sub = std::move(sub);
      }
      std::vector<std::string> cmd{"SUBSCRIBE", st->channel};
      reply r = co_await detail::redis_call(*st->sub, std::move(cmd));
      st->subscribed = !r.is_error();
    } catch (...) {
    }
    st->subscribing = false;
  }

  static asio::awaitable<void> acquire_impl(std::shared_ptr<state> st) {
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
      reply r =
          co_await detail::redis_eval(*st->conn, st->acquire, keys(*st), args(*st, w.id, "wait"));
      if (r.elements.at(0).integer == 1) {
        st->held.push_back(w.id);
        if (cancelled() || st->stopped) {  // granted, but the caller is gone: pass it on
          st->held.pop_back();
          st->send_release(w.id, st);
          throw system_error(asio::error::operation_aborted);
        }
        start_renewal(st);
        co_return;
      }
      if (!cancelled() && !st->stopped) {
        if (!st->subscribed && !st->subscribing) co_await subscribe(st);
        if (!w.kick && !cancelled() && !st->stopped) {
          w.timer.expires_after(st->poll);
          error_code ec;
          auto token = asio::redirect_error(asio::use_awaitable, ec);
          co_await w.timer.async_wait(token);
        }
      }
      if (cancelled() || st->stopped) {
        std::vector<std::string> leave_keys{st->queue, st->alive};
        std::vector<std::string> leave_args{w.id, st->channel};
        co_await detail::redis_eval(*st->conn, st->leave, std::move(leave_keys),
                                    std::move(leave_args));
        throw system_error(asio::error::operation_aborted);
      }
    }
  }

  std::shared_ptr<state> st_;
};

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_SEMAPHORE_HPP
