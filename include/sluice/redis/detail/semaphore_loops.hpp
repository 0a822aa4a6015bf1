// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_SEMAPHORE_LOOPS_HPP
#define SLUICE_REDIS_DETAIL_SEMAPHORE_LOOPS_HPP

// The coroutines that drive a redis::semaphore's state (semaphore_state.hpp):
// the acquire loop (queue, poll or wait for a release), the grant's
// bookkeeping, the renewal loop, the release subscriber and the status call.

#include <sluice/config.hpp>
#include <sluice/redis/connection.hpp>
#include <sluice/redis/detail/script.hpp>
#include <sluice/redis/detail/semaphore_state.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_timer.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace sluice::detail {

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
    asio::steady_timer timer(st->conn->get_executor());
    redis_sem_state::waiter w{redis_unique_id(), &timer};
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
          timer.expires_after(st->poll);
          error_code ec;
          auto token = asio::redirect_error(asio::use_awaitable, ec);
          co_await timer.async_wait(token);
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

#endif  // SLUICE_REDIS_DETAIL_SEMAPHORE_LOOPS_HPP
