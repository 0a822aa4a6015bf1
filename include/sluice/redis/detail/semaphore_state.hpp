// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_SEMAPHORE_STATE_HPP
#define SLUICE_REDIS_DETAIL_SEMAPHORE_STATE_HPP

// The client side of redis::semaphore: the permits this process holds (each
// with its fencing token and the moment its lease stops being certain), the
// local waiters, and the lease watchdog. The coroutines that drive it (acquire,
// renewal, the release subscriber) are in semaphore_loops.hpp.

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/stats_recorder.hpp>
#include <sluice/redis/connection.hpp>
#include <sluice/redis/detail/script.hpp>
#include <sluice/redis/detail/semaphore_scripts.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_timer.hpp>

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

  // One acquire() (or redis::acquire_all) waiting in this process, in the
  // frame of its coroutine, which owns the timer (an acquire_all call has a
  // waiter in each of its semaphores, all on its one timer).
  struct waiter {
    std::string id;
    asio::steady_timer* timer;
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
    prefix = redis_tagged("sluice:sem:", name) + ":";
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
      w->timer->cancel();
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

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_SEMAPHORE_STATE_HPP
