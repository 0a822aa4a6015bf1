// SPDX-License-Identifier: BSL-1.0
// Fuzz target: condition (and the lock it owns) against a reference model: a
// lock counter with its FIFO list, the condition's FIFO list, and the loop's
// ready queue, written plainly from the documented semantics.
//
// Every task is a coroutine: acquire the lock, wait(), and end holding the
// lock (also when cancelled: wait() re-acquires it first). Each step is one
// byte (plus an argument byte for some):
//   0 spawn a task                     1 cancel task k (terminal/total)
//   2 notify(n) / notify_all()         3 release the lock (for holder k)
//   4 try_acquire the lock             5..7 poll
// After every step locked(), the waiters of the lock and of the condition
// must match; after every poll, which tasks finished and how. At the end the
// tasks are notified and the lock handed on until every task finished exactly
// once and the lock is free: no wakeup and no lock was lost.

#include <sluice/condition.hpp>

#include "fuzz.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

namespace {

using sluice_fuzz::probe;

enum class st {
  pending,
  lock_waiting,  // the first acquire (cancellable)
  lock_granted,
  cond_waiting,
  cond_woken,      // notified or cancelled, not yet resumed
  relock_waiting,  // wait() re-acquiring the lock (not cancellable)
  relock_granted,
  done_ok,  // holds the lock
  done_aborted_holding,
  done_aborted
};

struct model_task {
  st state = st::pending;
  bool cancelled = false;  // the coroutine's cancellation state (terminal)
  bool notified = false;
  bool released = false;  // the script released the lock it ended with
};

struct model {
  std::size_t lock_value = 1;
  std::deque<std::size_t> lock_fifo, cond_fifo;
  std::vector<model_task> t;
  std::size_t anonymous = 0;  // lock taken by try_acquire()
  sluice_fuzz::model_loop loop;

  bool locked() const { return lock_value == 0 || !lock_fifo.empty(); }

  bool release() {
    if (lock_value >= 1) return false;
    if (!lock_fifo.empty()) {
      const std::size_t id = lock_fifo.front();
      lock_fifo.pop_front();
      if (t[id].state == st::lock_waiting) {
        t[id].state = st::lock_granted;
        loop.post([this, id] { lock_granted(id); });
      } else {
        t[id].state = st::relock_granted;
        loop.post([this, id] { finish_wait(id); });
      }
      return true;
    }
    lock_value = 1;
    return true;
  }
  bool try_lock() {
    if (lock_value == 1 && lock_fifo.empty()) {
      lock_value = 0;
      return true;
    }
    return false;
  }

  void start(std::size_t id) {
    if (try_lock()) {
      enter_wait(id);
    } else {
      lock_fifo.push_back(id);
      t[id].state = st::lock_waiting;
    }
  }
  void lock_granted(std::size_t id) {
    if (t[id].cancelled) {  // acquire(): granted, then cancelled: hands it on
      release();
      t[id].state = st::done_aborted;
      return;
    }
    enter_wait(id);
  }
  void enter_wait(std::size_t id) {
    release();
    cond_fifo.push_back(id);
    t[id].state = st::cond_waiting;
  }
  // A notified waiter resumes one post later; a cancelled one two (the
  // cancellation handler posts the abort, which posts the completion).
  void wake(std::size_t id, bool notified) {
    t[id].state = st::cond_woken;
    t[id].notified = notified;
    if (notified) {
      loop.post([this, id] { relock(id); });
    } else {
      loop.post([this, id] { loop.post([this, id] { relock(id); }); });
    }
  }
  void relock(std::size_t id) {
    if (try_lock()) {
      finish_wait(id);
    } else {
      lock_fifo.push_back(id);
      t[id].state = st::relock_waiting;
    }
  }
  void finish_wait(std::size_t id) {
    auto& x = t[id];
    if (!x.notified) {
      x.state = st::done_aborted_holding;
    } else if (x.cancelled) {
      // Notified, then cancelled: the notification goes to the next waiter.
      notify(1);
      x.state = st::done_aborted_holding;
    } else {
      x.state = st::done_ok;
    }
  }
  void notify(std::size_t n) {
    for (; n > 0 && !cond_fifo.empty(); --n) {
      const std::size_t id = cond_fifo.front();
      cond_fifo.pop_front();
      wake(id, true);
    }
  }
  void cancel(std::size_t id, bool terminal) {
    auto& x = t[id];
    x.cancelled = terminal;
    if (!terminal) return;  // coroutines see terminal cancellation only
    if (x.state == st::lock_waiting) {
      lock_fifo.erase(std::find(lock_fifo.begin(), lock_fifo.end(), id));
      x.state = st::lock_granted;  // resumes with operation_aborted
      loop.post([this, id] { loop.post([this, id] { t[id].state = st::done_aborted; }); });
    } else if (x.state == st::cond_waiting) {
      cond_fifo.erase(std::find(cond_fifo.begin(), cond_fifo.end(), id));
      wake(id, false);
    }
  }
  bool holds(std::size_t id) const {
    return (t[id].state == st::done_ok || t[id].state == st::done_aborted_holding) &&
           !t[id].released;
  }
};

asio::awaitable<void> acquire_and_wait(sluice::condition& c) {
  co_await c.acquire();
  co_await c.wait();
}

void check(const sluice::condition& c, const model& m) {
  if (sluice_fuzz::trace())
    std::fprintf(stderr, "locked %d/%d cond %zu/%zu lock %zu/%zu\n", int(c.locked()),
                 int(m.locked()), c.waiters(), m.cond_fifo.size(),
                 const_cast<sluice::condition&>(c).get_lock().waiters(), m.lock_fifo.size());
  FUZZ_CHECK(c.locked() == m.locked());
  FUZZ_CHECK(c.waiters() == m.cond_fifo.size());
  FUZZ_CHECK(const_cast<sluice::condition&>(c).get_lock().waiters() == m.lock_fifo.size());
}

void check_done(const std::vector<std::unique_ptr<probe>>& probes, const model& m) {
  for (std::size_t i = 0; i < probes.size(); ++i) {
    const probe& p = *probes[i];
    const st s = m.t[i].state;
    if (sluice_fuzz::trace())
      std::fprintf(stderr, "task %zu model=%d done=%d ok=%d\n", i, int(s), int(p.done()),
                   int(p.ok()));
    const bool done = s == st::done_ok || s == st::done_aborted_holding || s == st::done_aborted;
    FUZZ_CHECK(done || s == st::lock_waiting || s == st::cond_waiting || s == st::relock_waiting);
    FUZZ_CHECK(p.done() == done);
    if (!done) continue;
    FUZZ_CHECK(p.ok() == (s == st::done_ok));
    if (!p.ok()) FUZZ_CHECK(sluice_fuzz::is_error(p.error, asio::error::operation_aborted));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sluice_fuzz::script in(data, size);
  std::vector<std::unique_ptr<probe>> probes;  // outlive the loop
  sluice::testing::virtual_loop loop;
  sluice::condition c{loop.get_executor()};
  model m;

  auto poll = [&] {
    loop.poll();
    m.loop.run();
    check_done(probes, m);
  };
  auto notify = [&](std::size_t n) {
    bool threw = false;
    try {
      if (n == std::numeric_limits<std::size_t>::max()) {
        c.notify_all();
      } else {
        c.notify(n);
      }
    } catch (const std::logic_error&) {
      threw = true;
    }
    FUZZ_CHECK(threw == !m.locked());
    if (!threw) m.notify(n);
  };
  // Releases the lock for holder k (a task, try_acquire's holder, or nobody).
  auto release = [&](std::uint8_t b) {
    std::vector<std::size_t> holders;
    for (std::size_t i = 0; i < m.t.size(); ++i)
      if (m.holds(i)) holders.push_back(i);
    const std::size_t k = b % (holders.size() + 1);
    if (k == holders.size() && m.anonymous == 0 && m.lock_value == 0) return;  // someone holds it
    bool threw = false;
    try {
      c.release();
    } catch (const std::logic_error&) {
      threw = true;
    }
    if (k < holders.size()) {
      m.t[holders[k]].released = true;
    } else if (m.anonymous > 0) {
      --m.anonymous;
    }
    FUZZ_CHECK(threw == !m.release());
  };

  while (!in.done() && probes.size() < 48) {
    switch (in.next() % 8) {
      case 0: {
        probes.push_back(std::make_unique<probe>());
        m.t.emplace_back();
        const std::size_t id = probes.size() - 1;
        sluice_fuzz::spawn(loop.get_executor(), *probes[id], acquire_and_wait(c));
        m.loop.post([&m, id] { m.start(id); });
        break;
      }
      case 1: {
        if (auto c = sluice_fuzz::cancel_step(
                in, probes, [&](std::size_t i) { return m.t[i].state != st::pending; }))
          m.cancel(c->first, c->second);
        break;
      }
      case 2: {
        const std::size_t n = in.next() % 4;
        notify(n == 0 ? std::numeric_limits<std::size_t>::max() : n);
        break;
      }
      case 3:
        release(in.next());
        break;
      case 4: {
        const bool ok = c.get_lock().try_acquire();
        FUZZ_CHECK(ok == m.try_lock());
        if (ok) ++m.anonymous;
        break;
      }
      default:
        poll();
        break;
    }
    check(c, m);
  }

  // Drain: hand the lock on and notify until every task has finished.
  poll();
  for (int round = 0; round < 1000; ++round) {
    bool holder = m.anonymous > 0;
    for (std::size_t i = 0; i < m.t.size(); ++i) holder = holder || m.holds(i);
    if (holder) {
      release(0);
    } else if (!m.cond_fifo.empty()) {
      FUZZ_CHECK(c.get_lock().try_acquire() && m.try_lock());
      ++m.anonymous;
      notify(std::numeric_limits<std::size_t>::max());
    } else {
      break;
    }
    poll();
    check(c, m);
  }
  check(c, m);
  FUZZ_CHECK(m.lock_value == 1 && m.lock_fifo.empty() && m.cond_fifo.empty());
  FUZZ_CHECK(!c.locked());
  for (const auto& p : probes) FUZZ_CHECK(p->completions == 1);
  return 0;
}
