// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_ALL_OPS_HPP
#define SLUICE_REDIS_DETAIL_ALL_OPS_HPP

// The client side of redis::acquire_all: one call's budgets (semaphores and
// rate limiters on one connection), its script arguments, and the loop that
// asks, sleeps and asks again until every budget is taken at once.

#include <sluice/config.hpp>
#include <sluice/redis/connection.hpp>
#include <sluice/redis/detail/all_scripts.hpp>
#include <sluice/redis/detail/rate_state.hpp>
#include <sluice/redis/detail/script.hpp>
#include <sluice/redis/detail/semaphore_loops.hpp>
#include <sluice/redis/detail/semaphore_state.hpp>
#include <sluice/redis/semaphore_permit.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_timer.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sluice::detail {

// One budget of a call: a semaphore (one permit) or n units of a limiter.
struct redis_all_budget {
  std::shared_ptr<redis_sem_state> sem;
  std::shared_ptr<redis_rate_state> rate;
  std::size_t n = 1;
  const std::shared_ptr<redis::connection>& conn() const { return sem ? sem->conn : rate->conn; }
};

// The scripts, per thread (their SHA is the same on every server; a
// connection is used on one thread).
inline redis_script& redis_all_acquire_script() {
  thread_local redis_script s{redis_all_acquire_lua.c_str(), {}};
  return s;
}
inline redis_script& redis_all_drop_script() {
  thread_local redis_script s{redis_all_drop_lua.c_str(), {}};
  return s;
}

// One acquire_all call; loop-affine like its budgets.
struct redis_all_call {
  std::shared_ptr<redis::connection> conn;
  std::vector<redis_all_budget> budgets;
  std::vector<std::string> keys;
  std::chrono::milliseconds poll{250}, ttl{2500};

  explicit redis_all_call(std::vector<redis_all_budget> bs)
      : conn(bs.at(0).conn()), budgets(std::move(bs)) {
    bool sems = false;
    for (const auto& b : budgets) {
      if (b.sem) {
        keys.insert(keys.end(), b.sem->keys.begin(), b.sem->keys.end());
        poll = sems ? std::min(poll, b.sem->poll) : b.sem->poll;
        ttl = sems ? std::max(ttl, b.sem->waiter_ttl) : b.sem->waiter_ttl;
        sems = true;
      } else {
        for (const char* k : {"", ":queue", ":alive", ":ticket", ":weights"})
          keys.push_back(b.rate->key + k);
      }
    }
    ttl = std::max(ttl, poll * 10);
  }

  std::vector<std::string> args(const std::string& id) const {
    std::vector<std::string> a{id, std::to_string(ttl.count()), std::to_string(budgets.size())};
    for (const auto& b : budgets) {
      if (b.sem) {
        a.insert(
            a.end(),
            {"s", std::to_string(b.sem->permits), std::to_string(b.sem->lease.count()),
             std::to_string(b.sem->grace.count()), std::to_string(b.sem->seen), b.sem->channel});
      } else {
        a.insert(a.end(), {"r", std::to_string(b.rate->calls), std::to_string(b.rate->per.count()),
                           std::to_string(b.n)});
      }
    }
    return a;
  }

  bool stopped() const {
    return std::any_of(budgets.begin(), budgets.end(),
                       [](const redis_all_budget& b) { return b.sem && b.sem->stopped; });
  }

  // Takes back everything of `id` (pipelined, not awaited; a lost one leaves
  // its queue entries to expire after ttl, its permits after their lease).
  void send_drop(const std::string& id) const {
    try {
      redis_eval_detached_reply(*conn, redis_all_drop_script(), keys, args(id), [](bool) {});
    } catch (...) {
    }
  }
};

// What a grant of all became: a permit per semaphore, in the call's order.
struct redis_all_grant {
  std::vector<redis::semaphore_permit> permits;
};

// Records the grant `r` of `id`, sent at `sent`. A semaphore part that is
// not certain even now (Sentinel) gives everything back: nullopt.
inline std::optional<redis_all_grant> redis_all_take(const redis_all_call& c, const std::string& id,
                                                     const redis::reply& r,
                                                     redis_clock::time_point sent,
                                                     redis_clock::time_point asked) {
  redis_all_grant g;
  std::size_t token = 2;
  for (const auto& b : c.budgets) {
    if (!b.sem) continue;
    auto h = redis_sem_add_held(b.sem, id, r.elements.at(token++).integer, sent);
    if (!h) {
      g.permits.clear();  // releases the ones taken
      c.send_drop(id);
      return std::nullopt;
    }
    g.permits.push_back(redis_sem_permit_access::make(b.sem, std::move(h)));
  }
  const auto now = redis_clock::now();
  for (const auto& b : c.budgets) {
    if (b.sem) {
      ++b.sem->stats.acquired;
      b.sem->stats.record_wait(now - asked);
    } else {
      b.rate->granted(b.n, asked);
    }
  }
  return g;
}

// The acquire script, following the caller's cancellation; a call that got
// no reply takes back `id` behind it (whatever the script did).
inline asio::awaitable<redis::reply> redis_all_eval_or_drop(std::shared_ptr<redis_all_call> c,
                                                            std::string id) {
  try {
    co_return co_await redis_eval(*c->conn, redis_all_acquire_script(), c->keys, c->args(id),
                                  redis_cancel::follow);
  } catch (const system_error&) {
    c->send_drop(id);
    throw;
  }
}

// One acquire_all(): ask, and until granted sleep until the window has room
// (at most a poll interval) or a semaphore announces a release. Returns the
// grant as a Held (redis::all_held).
template <class Held>
asio::awaitable<Held> redis_all_acquire(std::shared_ptr<redis_all_call> c) {
  const auto asked = redis_clock::now();
  auto cs = co_await asio::this_coro::cancellation_state;
  auto cancelled = [&] {
    return cs.cancelled() != asio::cancellation_type::none;
  };
  try {
    if (cancelled() || c->stopped()) throw system_error(asio::error::operation_aborted);
    const std::string id = redis_unique_id();
    asio::steady_timer timer(c->conn->get_executor());
    // A waiter in each semaphore of this process: its releases wake the call.
    std::list<redis_sem_state::waiter> ws;
    struct unlink {
      std::vector<std::pair<redis_sem_state*, std::list<redis_sem_state::waiter*>::iterator>> at;
      ~unlink() {
        for (auto& [s, it] : at) s->waiters.erase(it);
      }
    } guard;
    for (const auto& b : c->budgets) {
      if (!b.sem) continue;
      ws.push_back({id, &timer});
      b.sem->waiters.push_back(&ws.back());
      guard.at.emplace_back(b.sem.get(), std::prev(b.sem->waiters.end()));
    }
    auto kicked = [&] {
      return std::any_of(ws.begin(), ws.end(), [](const auto& w) { return w.kick; });
    };
    for (;;) {
      for (auto& w : ws) w.kick = false;
      const auto sent = redis_clock::now();
      redis::reply r = co_await redis_all_eval_or_drop(c, id);
      if (r.elements.at(0).integer == 1) {
        if (cancelled() || c->stopped()) {  // granted, but the caller is gone: give it back
          c->send_drop(id);
          throw system_error(asio::error::operation_aborted);
        }
        if (auto g = redis_all_take(*c, id, r, sent, asked)) co_return Held(std::move(*g));
      }
      const std::int64_t hint = r.elements.at(1).integer;
      if (!cancelled() && !c->stopped()) {
        for (const auto& b : c->budgets)
          if (b.sem && !b.sem->subscribed && !b.sem->subscribing)
            co_await redis_sem_subscribe(b.sem);
        if (!kicked() && !cancelled() && !c->stopped()) {
          auto d = std::chrono::duration_cast<redis_clock::duration>(c->poll);
          if (hint > 0) d = std::min(d, redis_clock::duration(std::chrono::microseconds(hint)));
          timer.expires_after(d);
          error_code ec;
          auto token = asio::redirect_error(asio::use_awaitable, ec);
          co_await timer.async_wait(token);
        }
      }
      if (cancelled() || c->stopped()) {
        co_await redis_eval(*c->conn, redis_all_drop_script(), c->keys, c->args(id));
        throw system_error(asio::error::operation_aborted);
      }
    }
  } catch (const system_error& e) {
    if (e.code() == asio::error::operation_aborted)
      for (const auto& b : c->budgets) ++(b.sem ? b.sem->stats : b.rate->stats).cancelled;
    throw;
  }
}

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_ALL_OPS_HPP
