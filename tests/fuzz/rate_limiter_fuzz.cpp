// SPDX-License-Identifier: BSL-1.0
// Fuzz target: rate_limiter against a reference model: a log of grant times
// (the sliding window: at most `calls` units in any window (t - per, t]) and
// a FIFO list of waiters, in virtual time.
//
// Byte 0: calls (1..3) and per (100, 200 or 300 ms). Then each step is one
// byte, plus argument bytes:
//   0 spawn a coroutine acquire(n)      1 async_acquire(n) with a callback token
//   2 cancel waiter k (terminal/total)  3 try_acquire(n)
//   4 advance virtual time (0..175 ms)  5..7 poll
// n is 1..calls+1 (calls+1 must throw invalid_argument). After every step
// waiters() must match; after every poll, which waiters completed, how, and
// at which virtual instant (exactly when the model grants them: never early,
// never later than needed). At the end time runs on until everyone is
// served; every waiter completed exactly once, and the grants that were kept
// never put more than `calls` units in any window.

#include <sluice/rate_limiter.hpp>

#include "fuzz.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace {

using sluice_fuzz::probe;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

enum class st { pending, waiting, granted, aborted, held, done_aborted };

struct model_waiter {
  std::size_t n = 1;
  bool coro = false;
  bool cancelled = false;
  st state = st::pending;
  nanoseconds granted_at{-1};
};

struct model {
  std::size_t calls = 1;
  nanoseconds per{0};
  nanoseconds now{0};
  std::deque<std::pair<nanoseconds, std::size_t>> starts;  // grant time, units
  std::deque<std::size_t> fifo;
  std::vector<model_waiter> w;
  sluice_fuzz::model_loop loop;

  std::size_t used_at(nanoseconds t) const {
    std::size_t u = 0;
    for (const auto& [at, n] : starts)
      if (at + per > t) u += n;
    return u;
  }
  // The earliest instant >= now at which n more units fit in the window.
  nanoseconds ready_at(std::size_t n) const {
    nanoseconds t = now;
    for (;;) {
      if (used_at(t) + n <= calls) return t;
      nanoseconds next = nanoseconds::max();  // the next expiry after t
      for (const auto& [at, k] : starts)
        if (at + per > t) next = std::min(next, at + per);
      t = next;
    }
  }
  void take(std::size_t n) { starts.emplace_back(now, n); }
  void give_back(std::size_t n, nanoseconds at) {
    for (auto it = starts.begin(); it != starts.end(); ++it) {
      if (it->first == at && it->second >= n) {
        it->second -= n;
        if (it->second == 0) starts.erase(it);
        return;
      }
    }
    for (auto it = starts.begin(); it != starts.end() && n > 0;) {  // spread over merged entries
      if (it->first == at) {
        const std::size_t k = std::min(n, it->second);
        it->second -= k;
        n -= k;
        if (it->second == 0) {
          it = starts.erase(it);
          continue;
        }
      }
      ++it;
    }
  }
  // Grants every waiter that is ready now, in order.
  void service() {
    while (!fifo.empty() && ready_at(w[fifo.front()].n) <= now) {
      const std::size_t id = fifo.front();
      fifo.pop_front();
      take(w[id].n);
      w[id].state = st::granted;
      w[id].granted_at = now;
      loop.post([this, id] { resume_granted(id); });
    }
  }
  void resume_granted(std::size_t id) {
    auto& x = w[id];
    if (x.coro && x.cancelled) {  // granted, then cancelled: gives the grant back
      x.state = st::done_aborted;
      give_back(x.n, x.granted_at);
      service();
      return;
    }
    x.state = st::held;
  }
  void initiate(std::size_t id) {
    auto& x = w[id];
    if (fifo.empty() && ready_at(x.n) <= now) {
      take(x.n);
      x.granted_at = now;
      if (x.coro) {
        x.state = st::held;
      } else {
        x.state = st::granted;
        loop.post([this, id] { w[id].state = st::held; });
      }
      return;
    }
    fifo.push_back(id);
    x.state = st::waiting;
  }
  void cancel(std::size_t id, bool terminal) {
    auto& x = w[id];
    if (x.coro) x.cancelled = terminal;
    if (x.state != st::waiting || (x.coro && !terminal)) return;
    fifo.erase(std::find(fifo.begin(), fifo.end(), id));
    x.state = st::aborted;
    loop.post([this, id] { loop.post([this, id] { w[id].state = st::done_aborted; }); });
    service();
  }
  // Virtual time runs to `until`, firing the limiter's timer on the way.
  void run_until(nanoseconds until) {
    for (;;) {
      loop.run();
      if (fifo.empty()) break;
      const nanoseconds t = ready_at(w[fifo.front()].n);
      if (t > until) break;
      now = t;
      service();
    }
    now = std::max(now, until);
    loop.run();
  }
};

struct real_waiter : probe {
  nanoseconds at{-1};  // virtual time of a successful completion
};

void check_done(const std::vector<std::unique_ptr<real_waiter>>& probes, const model& m) {
  for (std::size_t i = 0; i < probes.size(); ++i) {
    const real_waiter& p = *probes[i];
    const model_waiter& x = m.w[i];
    if (sluice_fuzz::trace())
      std::fprintf(stderr, "waiter %zu n=%zu coro=%d model=%d@%lld done=%d ok=%d at=%lld\n", i, x.n,
                   int(p.coro), int(x.state), static_cast<long long>(x.granted_at.count()),
                   int(p.done()), int(p.ok()), static_cast<long long>(p.at.count()));
    FUZZ_CHECK(x.state == st::waiting || x.state == st::held || x.state == st::done_aborted);
    FUZZ_CHECK(p.done() == (x.state != st::waiting));
    if (!p.done()) continue;
    FUZZ_CHECK(p.ok() == (x.state == st::held));
    if (p.ok()) FUZZ_CHECK(p.at == x.granted_at);  // exactly when the window allows
    if (!p.ok())
      FUZZ_CHECK(p.coro ? sluice_fuzz::is_error(p.error, asio::error::operation_aborted)
                        : p.ec == asio::error::operation_aborted);
  }
}

asio::awaitable<void> acquire_n(sluice::rate_limiter& r, std::size_t n, real_waiter* p,
                                sluice::testing::virtual_loop& loop) {
  co_await r.acquire(n);
  p->at = loop.now();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sluice_fuzz::script in(data, size);
  std::vector<std::unique_ptr<real_waiter>> probes;  // outlive the loop
  sluice::testing::virtual_loop loop;
  model m;
  const std::uint8_t head = in.next();
  m.calls = 1 + head % 3;
  m.per = milliseconds(100 * (1 + (head / 3) % 3));
  sluice::rate_limiter lim{loop.get_executor(), m.calls, m.per};
  std::vector<nanoseconds> try_grants;  // try_acquire's successes (1 unit each)

  auto add = [&](std::size_t n, bool coro) {
    probes.push_back(std::make_unique<real_waiter>());
    probes.back()->coro = coro;
    m.w.push_back(model_waiter{n, coro, false, st::pending, nanoseconds(-1)});
    return probes.size() - 1;
  };
  auto poll = [&] {
    loop.poll();
    m.loop.run();
    check_done(probes, m);
  };

  while (!in.done() && probes.size() < 64) {
    switch (in.next() % 8) {
      case 0:
      case 1: {
        const bool coro = in.next() % 2 == 0;
        const std::size_t n = 1 + in.next() % (m.calls + 1);
        if (n > m.calls) {
          bool threw = false;
          try {
            if (coro) {
              (void)lim.acquire(n);
            } else {
              lim.async_acquire(n, [](sluice::error_code) {});
            }
          } catch (const std::invalid_argument&) {
            threw = true;
          }
          FUZZ_CHECK(threw);
          break;
        }
        const std::size_t id = add(n, coro);
        real_waiter* p = probes[id].get();
        if (coro) {
          sluice_fuzz::spawn(loop.get_executor(), *p, acquire_n(lim, n, p, loop));
          m.loop.post([&m, id] { m.initiate(id); });
        } else {
          lim.async_acquire(n, sluice_fuzz::callback(*p, [p, &loop](sluice::error_code ec) {
                              if (!ec) p->at = loop.now();
                            }));
          m.initiate(id);
        }
        break;
      }
      case 2:
        if (auto c = sluice_fuzz::cancel_step(
                in, probes, [&](std::size_t i) { return m.w[i].state != st::pending; }))
          m.cancel(c->first, c->second);
        break;
      case 3: {
        const bool ok = lim.try_acquire();
        const bool expect = m.fifo.empty() && m.ready_at(1) <= m.now;
        FUZZ_CHECK(ok == expect);
        if (ok) {
          m.take(1);
          try_grants.push_back(m.now);
        }
        break;
      }
      case 4: {
        const nanoseconds d = milliseconds(25 * (in.next() % 8));
        loop.run_for(d);
        m.run_until(m.now + d);
        FUZZ_CHECK(loop.now() == m.now);
        check_done(probes, m);
        break;
      }
      default:
        poll();
        break;
    }
    FUZZ_CHECK(lim.waiters() == m.fifo.size());
  }

  // Drain: time runs on until nobody waits.
  poll();
  for (int round = 0; round < 200 && !m.fifo.empty(); ++round) {
    loop.run_for(m.per);
    m.run_until(m.now + m.per);
    check_done(probes, m);
  }
  FUZZ_CHECK(m.fifo.empty() && lim.waiters() == 0);
  for (const auto& p : probes) FUZZ_CHECK(p->completions == 1);

  // The grants that were kept never exceed `calls` units in any window.
  std::vector<std::pair<nanoseconds, std::size_t>> grants;
  for (std::size_t i = 0; i < probes.size(); ++i)
    if (probes[i]->ok()) grants.emplace_back(probes[i]->at, m.w[i].n);
  for (nanoseconds t : try_grants) grants.emplace_back(t, 1);
  for (const auto& [t, n] : grants) {
    std::size_t in_window = 0;
    for (const auto& [u, k] : grants)
      if (u <= t && u + m.per > t) in_window += k;
    FUZZ_CHECK(in_window <= m.calls);
  }
  return 0;
}
