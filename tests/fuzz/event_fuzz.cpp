// SPDX-License-Identifier: BSL-1.0
// Fuzz target: event against a reference model (a flag and a FIFO list).
//
// Each step is one byte (plus argument bytes for a cancel):
//   0 spawn a coroutine wait()          1 async_wait with a callback token
//   2 cancel waiter k (terminal/total)  3 set()   4 clear()   5..7 poll
// After every step is_set() and waiters() must match the model; after every
// poll, which waiters completed and how. At the end set() wakes everyone:
// every waiter completed exactly once, no wakeup was lost.

#include <sluice/event.hpp>

#include "fuzz.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

namespace {

using sluice_fuzz::probe;

enum class st { pending, waiting, woken, aborted, done_ok, done_aborted };

struct model {
  bool set = false;
  std::deque<std::size_t> fifo;
  std::vector<st> w;
  std::vector<bool> coro;
  sluice_fuzz::model_loop loop;

  void wake(std::size_t id) {
    w[id] = st::woken;
    loop.post([this, id] { w[id] = st::done_ok; });
  }
  void initiate(std::size_t id, bool is_coro) {
    if (set && is_coro) {
      w[id] = st::done_ok;  // wait() does not suspend on a set event
    } else if (set) {
      wake(id);
    } else {
      fifo.push_back(id);
      w[id] = st::waiting;
    }
  }
  void do_set() {
    if (set) return;
    set = true;
    while (!fifo.empty()) {
      wake(fifo.front());
      fifo.pop_front();
    }
  }
  void cancel(std::size_t id, bool terminal) {
    if (w[id] != st::waiting || (coro[id] && !terminal)) return;
    fifo.erase(std::find(fifo.begin(), fifo.end(), id));
    w[id] = st::aborted;
    loop.post([this, id] { w[id] = st::done_aborted; });
  }
};

asio::awaitable<void> wait_on(sluice::event& e) {
  co_await e.wait();
}

void check_done(const std::vector<std::unique_ptr<probe>>& probes, const model& m) {
  for (std::size_t i = 0; i < probes.size(); ++i) {
    const probe& p = *probes[i];
    const st s = m.w[i];
    if (sluice_fuzz::trace())
      std::fprintf(stderr, "waiter %zu coro=%d model=%d done=%d ok=%d\n", i, int(p.coro), int(s),
                   int(p.done()), int(p.ok()));
    FUZZ_CHECK(s == st::waiting || s == st::done_ok || s == st::done_aborted);
    FUZZ_CHECK(p.done() == (s != st::waiting));
    if (p.done()) FUZZ_CHECK(p.ok() == (s == st::done_ok));
    if (p.done() && !p.ok())
      FUZZ_CHECK(p.coro ? sluice_fuzz::is_error(p.error, asio::error::operation_aborted)
                        : p.ec == asio::error::operation_aborted);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sluice_fuzz::script in(data, size);
  std::vector<std::unique_ptr<probe>> probes;  // outlive the loop
  sluice::testing::virtual_loop loop;
  sluice::event ev{loop.get_executor()};
  model m;
  auto add = [&](bool coro) {
    probes.push_back(std::make_unique<probe>());
    m.w.push_back(st::pending);
    m.coro.push_back(coro);
    return probes.size() - 1;
  };
  auto poll = [&] {
    loop.poll();
    m.loop.run();
    check_done(probes, m);
  };
  while (!in.done() && probes.size() < 64) {
    switch (in.next() % 8) {
      case 0: {
        const std::size_t id = add(true);
        sluice_fuzz::spawn(loop.get_executor(), *probes[id], wait_on(ev));
        m.loop.post([&m, id] { m.initiate(id, true); });
        break;
      }
      case 1: {
        const std::size_t id = add(false);
        ev.async_wait(sluice_fuzz::callback(*probes[id]));
        m.initiate(id, false);
        break;
      }
      case 2: {
        if (auto c = sluice_fuzz::cancel_step(in, probes,
                                              [&](std::size_t i) { return m.w[i] != st::pending; }))
          m.cancel(c->first, c->second);
        break;
      }
      case 3:
        ev.set();
        m.do_set();
        break;
      case 4:
        ev.clear();
        m.set = false;
        break;
      default:
        poll();
        break;
    }
    FUZZ_CHECK(ev.is_set() == m.set);
    FUZZ_CHECK(ev.waiters() == m.fifo.size());
  }
  // Drain: one set() wakes every waiter that is left.
  poll();
  ev.set();
  m.do_set();
  poll();
  FUZZ_CHECK(ev.waiters() == 0);
  for (const auto& p : probes) FUZZ_CHECK(p->completions == 1);
  return 0;
}
