// SPDX-License-Identifier: BSL-1.0
// Fuzz target: semaphore, bounded_semaphore and lock against a reference
// model (a counter and a FIFO list of waiters).
//
// Input: byte 0 picks the primitive and its initial value; then each step is
// one byte (plus an argument byte for some):
//   0 spawn a coroutine acquire()       1 async_acquire with a callback token
//   2 cancel waiter k (terminal/total)  3 release (by holder k, or unowned)
//   4 try_acquire()                     5..7 poll (run everything ready)
// After every step value(), waiters() and locked() must match the model;
// after every poll, which waiters completed and how. At the end everything
// is drained: every waiter completed exactly once, no permit was lost.

#include <sluice/lock.hpp>
#include <sluice/semaphore.hpp>

#include "fuzz.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <stdexcept>
#include <vector>

namespace {

using sluice_fuzz::probe;

enum class st { pending, waiting, granted, aborted, held, released, done_aborted };

struct model_waiter {
  bool coro = false;
  bool cancelled = false;  // a coroutine's cancellation state (terminal requested)
  st state = st::pending;
};

// The reference: a counter, a FIFO list, and the loop's ready queue.
struct model {
  std::size_t value = 0;
  std::size_t bound = 0;
  bool bounded = false;
  std::deque<std::size_t> fifo;
  std::vector<model_waiter> w;
  std::size_t anonymous = 0;  // permits taken by try_acquire()
  std::size_t unowned = 0;    // releases by nobody (plain semaphore only)
  sluice_fuzz::model_loop loop;

  bool locked() const { return value == 0 || !fifo.empty(); }

  // release(): to the oldest waiter, else to the pool. False: it must throw.
  bool release() {
    if (bounded && value >= bound) return false;
    if (!fifo.empty()) {
      const std::size_t id = fifo.front();
      fifo.pop_front();
      w[id].state = st::granted;
      loop.post([this, id] { resume_granted(id); });
      return true;
    }
    ++value;
    return true;
  }

  void resume_granted(std::size_t id) {
    if (w[id].coro && w[id].cancelled) {
      // Granted, then cancelled before it resumed: hands the permit on.
      w[id].state = st::done_aborted;
      release();
      return;
    }
    w[id].state = st::held;
  }

  // Both acquire() and async_acquire() start here.
  void initiate(std::size_t id, bool coro) {
    if (value > 0 && fifo.empty()) {
      --value;
      if (coro) {
        w[id].state = st::held;  // the uncontended path does not suspend
      } else {
        w[id].state = st::granted;
        loop.post([this, id] { w[id].state = st::held; });
      }
      return;
    }
    fifo.push_back(id);
    w[id].state = st::waiting;
  }

  void cancel(std::size_t id, bool terminal) {
    auto& m = w[id];
    if (m.coro) m.cancelled = terminal;  // asio's state keeps the last emit, filtered
    if (m.state != st::waiting || (m.coro && !terminal)) return;
    fifo.erase(std::find(fifo.begin(), fifo.end(), id));
    m.state = st::aborted;
    loop.post([this, id] { w[id].state = st::done_aborted; });
  }
};

template <class P>
std::size_t value_of(const P& p, const model& m) {
  if constexpr (std::is_same_v<P, sluice::lock>) {
    (void)p;
    return m.value;  // a lock has no value(); locked() is checked instead
  } else {
    return p.value();
  }
}

template <class P>
void check(const P& p, const model& m) {
  FUZZ_CHECK(value_of(p, m) == m.value);
  FUZZ_CHECK(p.waiters() == m.fifo.size());
  FUZZ_CHECK(p.locked() == m.locked());
}

// After a poll: every waiter is either still waiting or done as the model says.
void check_done(const std::vector<std::unique_ptr<probe>>& probes, const model& m) {
  for (std::size_t i = 0; i < probes.size(); ++i) {
    const probe& p = *probes[i];
    const st s = m.w[i].state;
    if (sluice_fuzz::trace())
      std::fprintf(stderr, "waiter %zu coro=%d model=%d done=%d ok=%d\n", i, int(p.coro), int(s),
                   int(p.done()), int(p.ok()));
    FUZZ_CHECK(s == st::waiting || s == st::held || s == st::released || s == st::done_aborted);
    FUZZ_CHECK(p.done() == (s != st::waiting));
    if (!p.done()) continue;
    FUZZ_CHECK(p.ok() == (s != st::done_aborted));
    if (!p.ok()) {
      FUZZ_CHECK(p.coro ? sluice_fuzz::is_error(p.error, asio::error::operation_aborted)
                        : p.ec == asio::error::operation_aborted);
    }
  }
}

template <class P>
void run(sluice_fuzz::script& in, std::size_t initial, bool bounded) {
  std::vector<std::unique_ptr<probe>> probes;  // outlive the loop
  sluice::testing::virtual_loop loop;
  P prim = [&] {
    if constexpr (std::is_same_v<P, sluice::lock>) {
      return P(loop.get_executor());
    } else {
      return P(loop.get_executor(), initial);
    }
  }();
  model m;
  m.value = m.bound = initial;
  m.bounded = bounded;

  auto add = [&](bool coro) {
    probes.push_back(std::make_unique<probe>());
    m.w.push_back(model_waiter{coro, false, st::pending});
    return probes.size() - 1;
  };
  auto release_one = [&](std::uint8_t b) {
    std::vector<std::size_t> holders;
    for (std::size_t i = 0; i < m.w.size(); ++i)
      if (m.w[i].state == st::held) holders.push_back(i);
    const std::size_t k = b % (holders.size() + 1);
    // Releasing a bounded primitive on behalf of nobody while someone holds it
    // would release their permit (misuse the model does not follow); it is
    // only tried when nothing is out, and must throw.
    if (k == holders.size() && m.anonymous == 0 && bounded && m.value != m.bound) return;
    bool threw = false;
    try {
      prim.release();
    } catch (const std::logic_error&) {
      threw = true;
    }
    if (k < holders.size()) {
      m.w[holders[k]].state = st::released;
    } else if (m.anonymous > 0) {
      --m.anonymous;
    } else if (!bounded) {
      ++m.unowned;
    }
    FUZZ_CHECK(threw == !m.release());
  };
  auto poll = [&] {
    loop.poll();
    m.loop.run();
    check_done(probes, m);
  };

  while (!in.done() && probes.size() < 64) {
    const std::uint8_t op = in.next() % 8;
    switch (op) {
      case 0: {
        const std::size_t id = add(true);
        sluice_fuzz::spawn(loop.get_executor(), *probes[id], [](P& s) -> asio::awaitable<void> {
          co_await s.acquire();
        }(prim));
        m.loop.post([&m, id] { m.initiate(id, true); });
        break;
      }
      case 1: {
        const std::size_t id = add(false);
        prim.async_acquire(sluice_fuzz::callback(*probes[id]));
        m.initiate(id, false);
        break;
      }
      case 2: {
        if (auto c = sluice_fuzz::cancel_step(
                in, probes, [&](std::size_t i) { return m.w[i].state != st::pending; }))
          m.cancel(c->first, c->second);
        break;
      }
      case 3:
        release_one(in.next());
        break;
      case 4: {
        const bool expect = m.value > 0 && m.fifo.empty();
        FUZZ_CHECK(prim.try_acquire() == expect);
        if (expect) {
          --m.value;
          ++m.anonymous;
        }
        break;
      }
      default:
        poll();
        break;
    }
    check(prim, m);
  }

  // Drain: hand every permit on until nobody waits (cancel the waiters of a
  // primitive nobody holds), then give every permit back.
  poll();
  for (int round = 0; round < 1000 && !m.fifo.empty(); ++round) {
    bool any_holder = m.anonymous > 0;
    for (const auto& x : m.w) any_holder = any_holder || x.state == st::held;
    if (any_holder) {
      release_one(0);
    } else {
      for (std::size_t id : std::vector<std::size_t>(m.fifo.begin(), m.fifo.end())) {
        probes[id]->signal.emit(asio::cancellation_type::terminal);
        m.cancel(id, true);
      }
    }
    poll();
    check(prim, m);
  }
  FUZZ_CHECK(m.fifo.empty());
  for (std::size_t i = 0; i < m.w.size(); ++i)
    if (m.w[i].state == st::held) release_one(static_cast<std::uint8_t>(0));
  while (m.anonymous > 0) release_one(0);
  poll();
  check(prim, m);
  // No permit lost: every permit is back in the pool.
  FUZZ_CHECK(m.value == initial + m.unowned);
  for (const auto& p : probes) FUZZ_CHECK(p->completions == 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sluice_fuzz::script in(data, size);
  const std::uint8_t head = in.next();
  const std::size_t initial = (head / 3) % 4;
  switch (head % 3) {
    case 0:
      run<sluice::semaphore>(in, initial, false);
      break;
    case 1:
      run<sluice::bounded_semaphore>(in, initial, true);
      break;
    default:
      run<sluice::lock>(in, 1, true);
      break;
  }
  return 0;
}
