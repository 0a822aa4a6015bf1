// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_SEMAPHORE_STATE_HPP
#define SLUICE_REDIS_DETAIL_SEMAPHORE_STATE_HPP

// The client side of redis::semaphore: the permits this process holds (each
// with its fencing token and the moment its lease stops being certain), the
// renewal loop, the lease watchdog and the pub/sub subscriber.

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/stats_recorder.hpp>
#include <sluice/redis/connection.hpp>
#include <sluice/redis/detail/script.hpp>
#include <sluice/redis/detail/semaphore_scripts.hpp>

#include <sluice/detail/asio.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace sluice::detail {

using redis_clock = std::chrono::steady_clock;

// t + d, saturating at time_point::max() (a lease of milliseconds::max()).
inline redis_clock::time_point redis_add_sat(redis_clock::time_point t,
                                             std::chrono::milliseconds d) {
  if (d.count() <= 0) return t;
  const auto room =
      std::chrono::duration_cast<std::chrono::milliseconds>(redis_clock::time_point::max() - t);
  if (d >= room) return redis_clock::time_point::max();
  return t + std::chrono::duration_cast<redis_clock::duration>(d);
}

// One permit this process holds.
struct redis_sem_held {
  redis_sem_held(std::string i, std::int64_t tok, redis_clock::time_point until,
                 const asio::any_io_executor& ex)
      : id(std::move(i)),
        token(tok),
        certain_until(until),
        granted_at(redis_clock::now()),
        signal(ex) {
    signal.expires_at(redis_clock::time_point::max());
  }
  std::string id;
  std::int64_t token;
  // The lease is certain until then: local send time of the grant or of the
  // last confirmed renewal + lease - drift margin (see also state::certain).
  redis_clock::time_point certain_until;
  std::string node;  // where it was granted or last renewed (Sentinel; else empty)
  redis_clock::time_point granted_at;  // for the hold time in stats()
  bool lost = false;
  bool released = false;
  bool owned = false;             // by a semaphore::permit (not release())
  asio::steady_timer signal;      // cancelled when lost or released
  std::function<void()> on_lost;  // run()'s hook
};

// The state of a redis::semaphore, shared with its renewal loop, its
// watchdog and its subscriber callbacks. Loop-affine.
struct redis_sem_state {
  using held_ptr = std::shared_ptr<redis_sem_held>;

  // One acquire() waiting in this process, in the frame of its coroutine.
  struct waiter {
    std::string id;
    asio::steady_timer timer;
    bool kick = false;  // a release was announced while it was not sleeping
  };

  std::shared_ptr<redis::connection> conn;
  std::shared_ptr<redis::connection> sub;  // SUBSCRIBEd to channel
  std::vector<std::string> keys;           // holders, queue, alive, ticket, meta, fence
  std::string prefix, channel;
  std::size_t permits;
  std::chrono::milliseconds lease, poll, waiter_ttl, renew_every, grace, margin, grace_margin;
  redis_script acquire{redis_sem_acquire_lua.c_str(), {}}, renew{redis_sem_renew_lua.c_str(), {}},
      drop{redis_sem_drop_lua.c_str(), {}}, status{redis_sem_status_lua.c_str(), {}};
  std::vector<held_ptr> held;    // permits this process holds, oldest first
  std::size_t lost_unowned = 0;  // lost permits of acquire() still to be release()d
  std::list<waiter*> waiters;    // in arrival (= ticket) order
  bool stopped = false;
  bool subscribed = false;
  bool subscribing = false;
  bool renewing = false;
  asio::steady_timer renew_timer;
  asio::steady_timer watchdog;
  std::vector<erased_handler<>> renewal_done;  // close() waiting for the loop
  std::size_t lost = 0;
  std::size_t failed_renewals = 0;
  std::int64_t seen = 0;  // the highest fencing token this process was granted
  std::size_t failed_releases = 0;
  // stats(): every grant to this client (its wait from the call, round trips
  // included), every hold from the grant to its release or loss, every wait
  // that ended in operation_aborted.
  stats_sink stats;

  redis_sem_state(std::shared_ptr<redis::connection> c, const std::string& name, std::size_t n,
                  std::chrono::milliseconds l, std::chrono::milliseconds p,
                  std::chrono::milliseconds ttl)
      : conn(std::move(c)),
        permits(n),
        lease(l),
        poll(p),
        waiter_ttl(ttl),
        renew_every(std::min(l / 3, std::chrono::milliseconds(1000))),
        grace(renew_every + std::max(renew_every / 2, std::chrono::milliseconds(300))),
        margin(l / 50 + std::chrono::milliseconds(5)),
        grace_margin(grace / 50 + std::chrono::milliseconds(5)),
        renew_timer(conn->get_executor()),
        watchdog(conn->get_executor()) {
    prefix = "sluice:sem:{" + name + "}:";
    for (const char* k : {"holders", "queue", "alive", "ticket", "meta", "fence"})
      keys.push_back(prefix + k);
    channel = prefix + "released";
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

  // Removes `id` from every key of the semaphore (pipelined, not awaited).
  void send_drop(const std::string& id, const std::shared_ptr<redis_sem_state>& self) {
    try {
      redis_eval_detached_reply(*conn, drop, {keys[0], keys[1], keys[2]}, {id, channel},
                                [self](bool ok) {
                                  if (!ok) ++self->failed_releases;
                                });
    } catch (...) {
      ++failed_releases;  // the lease returns it
    }
  }

  void unlink(const held_ptr& h) {
    held.erase(std::remove(held.begin(), held.end(), h), held.end());
  }

  // Returns a permit this process holds (a permit's reset, release()).
  void release(held_ptr h, const std::shared_ptr<redis_sem_state>& self) {
    if (h->lost || h->released) return;
    h->released = true;
    stats.record_hold(redis_clock::now() - h->granted_at);
    unlink(h);
    h->signal.cancel();
    send_drop(h->id, self);
    arm_watchdog(self);
  }

  // The permit is no longer certain: it counts as lost here first, before
  // the server may grant it elsewhere (once per permit).
  void lose(held_ptr h, const std::shared_ptr<redis_sem_state>& self) {
    if (h->lost || h->released) return;
    h->lost = true;
    ++lost;
    stats.record_hold(redis_clock::now() - h->granted_at);
    if (!h->owned) ++lost_unowned;
    unlink(h);
    send_drop(h->id, self);  // frees its place at once if the server still has it
    h->signal.cancel();
    if (h->on_lost) {
      auto f = std::move(h->on_lost);
      h->on_lost = nullptr;
      f();
    }
  }

  // Until when a permit granted or renewed on `node` at `until` (its lease
  // bound) is certain. Through Sentinel also no longer than the last moment
  // the sentinels' majority named that node primary + the grace - its drift:
  // a node promoted since then grants nothing before that (its grace starts
  // when it is first used, after the sentinels named it).
  redis_clock::time_point certain(const std::string& node, redis_clock::time_point until) const {
    const auto c = conn->primary_confirmed_at(node);
    if (c == redis_clock::time_point::max()) return until;
    if (c == redis_clock::time_point::min()) return c;
    return std::min(until, redis_add_sat(c, grace - grace_margin));
  }
  redis_clock::time_point certain(const redis_sem_held& h) const {
    return certain(h.node, h.certain_until);
  }

  // Arms the watchdog for the earliest moment a held permit stops being certain.
  void arm_watchdog(const std::shared_ptr<redis_sem_state>& self) {
    auto first = redis_clock::time_point::max();
    for (const auto& h : held) first = std::min(first, certain(*h));
    if (first == redis_clock::time_point::max() || stopped) {
      watchdog.cancel();
      return;
    }
    watchdog.expires_at(first);
    std::weak_ptr<redis_sem_state> weak = self;
    watchdog.async_wait([weak](error_code ec) {
      if (ec) return;  // re-armed or cancelled
      auto s = weak.lock();
      if (!s) return;
      const auto now = redis_clock::now();
      auto copy = s->held;
      for (const auto& h : copy)
        if (s->certain(*h) <= now) s->lose(h, s);
      s->arm_watchdog(s);
    });
  }

  std::vector<std::string> acquire_args(const std::string& id, const char* mode) const {
    return {std::to_string(permits),
            id,
            std::to_string(lease.count()),
            std::to_string(waiter_ttl.count()),
            mode,
            std::to_string(grace.count()),
            std::to_string(seen)};
  }
};

// Renews every permit held, every renew_every, while any is held.
inline asio::awaitable<void> redis_sem_renew_loop(std::shared_ptr<redis_sem_state> st) {
  while (!st->stopped && !st->held.empty()) {
    st->renew_timer.expires_after(st->renew_every);
    error_code ec;
    co_await st->renew_timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (st->stopped || st->held.empty()) break;
    auto batch = st->held;
    std::vector<std::string> a{std::to_string(st->permits), std::to_string(st->lease.count()),
                               std::to_string(st->grace.count()), std::to_string(st->seen)};
    for (const auto& h : batch) a.push_back(h->id);
    const auto sent = redis_clock::now();
    try {
      redis::reply r = co_await redis_eval(*st->conn, st->renew, st->keys, std::move(a));
      const auto until = redis_add_sat(sent, st->lease - st->margin);
      const std::string node = st->conn->node();
      for (std::size_t i = 0; i < batch.size() && i < r.elements.size(); ++i) {
        if (r.elements[i].integer == 1) {
          if (batch[i]->node != node) batch[i]->certain_until = until;  // re-claimed there
          batch[i]->certain_until = std::max(batch[i]->certain_until, until);
          batch[i]->node = node;
        } else {
          st->lose(batch[i], st);
        }
      }
      st->arm_watchdog(st);
    } catch (...) {
      ++st->failed_renewals;  // retried at the next tick (the call reconnects)
    }
  }
}

inline void redis_sem_start_renewal(const std::shared_ptr<redis_sem_state>& st) {
  if (st->renewing || st->stopped) return;
  st->renewing = true;
  asio::co_spawn(st->conn->get_executor(), redis_sem_renew_loop(st), [st](std::exception_ptr) {
    st->renewing = false;
    auto done = std::move(st->renewal_done);
    st->renewal_done.clear();
    for (auto& d : done) d.complete();
    if (!st->stopped && !st->held.empty()) redis_sem_start_renewal(st);
  });
}

// Subscribes the second connection to the release channel (once; again after
// its loss). Failures only mean polling. The connection is opened with the
// main one's options (AUTH, SELECT, timeouts).
inline asio::awaitable<void> redis_sem_subscribe(std::shared_ptr<redis_sem_state> st) {
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
      std::weak_ptr<redis_sem_state> weak = st;
      sub->on_message([weak](const redis::reply&) {
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
    redis::reply r = co_await redis_call(*st->sub, std::move(cmd));
    st->subscribed = !r.is_error();
  } catch (...) {
  }
  st->subscribing = false;
}

// The status script: {free permits, waiters} across the fleet.
inline asio::awaitable<redis::reply> redis_sem_status(std::shared_ptr<redis_sem_state> st) {
  std::vector<std::string> a{std::to_string(st->permits)};
  co_return co_await redis_eval(*st->conn, st->status, st->keys, std::move(a),
                                redis_cancel::follow);
}

// The acquire script for `id`, following the caller's cancellation; a call
// that got no reply drops `id` behind it (whatever the script did).
inline asio::awaitable<redis::reply> redis_sem_eval_or_drop(std::shared_ptr<redis_sem_state> st,
                                                            std::string id,
                                                            std::vector<std::string> a) {
  try {
    co_return co_await redis_eval(*st->conn, st->acquire, st->keys, std::move(a),
                                  redis_cancel::follow);
  } catch (const system_error& e) {
    // Cancelled, timed out or connection lost: the script may have queued
    // or granted `id`; drop it (on the next socket), so that no ghost entry
    // holds the line until waiter_ttl or a permit until its lease.
    st->send_drop(id, st);
    throw;
  }
}

// Records a grant sent at `sent` (just answered); starts the renewal loop and
// the watchdog. A grant that is not certain even now (through Sentinel: on a
// node the sentinels' majority has not named primary lately) is dropped at
// once: null.
inline redis_sem_state::held_ptr redis_sem_add_held(const std::shared_ptr<redis_sem_state>& st,
                                                    std::string id, std::int64_t token,
                                                    redis_clock::time_point sent) {
  st->seen = std::max(st->seen, token);
  std::string node = st->conn->node();
  const auto until = redis_add_sat(sent, st->lease - st->margin);
  if (st->certain(node, until) <= redis_clock::now()) {
    st->send_drop(id, st);
    return nullptr;
  }
  auto h = std::make_shared<redis_sem_held>(std::move(id), token, until, st->conn->get_executor());
  h->node = std::move(node);
  st->held.push_back(h);
  redis_sem_start_renewal(st);
  st->arm_watchdog(st);
  return h;
}

// One acquire(): queue, poll or wait for a release, until granted; see the
// semaphore's class comment for cancellation.
inline asio::awaitable<redis_sem_state::held_ptr> redis_sem_acquire(
    std::shared_ptr<redis_sem_state> st) {
  const auto start = redis_clock::now();
  auto cs = co_await asio::this_coro::cancellation_state;
  auto cancelled = [&] {
    return cs.cancelled() != asio::cancellation_type::none;
  };
  try {
    if (cancelled() || st->stopped) throw system_error(asio::error::operation_aborted);
    redis_sem_state::waiter w{redis_unique_id(), asio::steady_timer(st->conn->get_executor())};
    st->waiters.push_back(&w);
    auto it = std::prev(st->waiters.end());
    struct unlink {
      redis_sem_state& s;
      std::list<redis_sem_state::waiter*>::iterator it;
      ~unlink() { s.waiters.erase(it); }
    } guard{*st, it};
    for (;;) {
      w.kick = false;
      const auto sent = redis_clock::now();
      redis::reply r = co_await redis_sem_eval_or_drop(st, w.id, st->acquire_args(w.id, "wait"));
      if (r.elements.at(0).integer == 1) {
        if (cancelled() || st->stopped) {  // granted, but the caller is gone: pass it on
          st->send_drop(w.id, st);
          throw system_error(asio::error::operation_aborted);
        }
        if (auto h = redis_sem_add_held(st, w.id, r.elements.at(2).integer, sent)) {
          ++st->stats.acquired;
          st->stats.record_wait(redis_clock::now() - start);
          co_return h;
        }
      }
      if (!cancelled() && !st->stopped) {
        if (!st->subscribed && !st->subscribing) co_await redis_sem_subscribe(st);
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
        co_await redis_eval(*st->conn, st->drop, std::move(k), std::move(a));
        throw system_error(asio::error::operation_aborted);
      }
    }
  } catch (const system_error& e) {
    if (e.code() == asio::error::operation_aborted) ++st->stats.cancelled;
    throw;
  }
}

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_SEMAPHORE_STATE_HPP
