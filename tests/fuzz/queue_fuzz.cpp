// SPDX-License-Identifier: BSL-1.0
// Fuzz target: queue (bounded and unbounded, shutdown, join) against a
// reference model (a deque of items and FIFO lists of getters, putters and
// joiners, written plainly from the documented semantics).
//
// Byte 0: maxsize (0..3, 0 = unbounded). Then each step is one byte (plus an
// argument byte for some):
//   0 spawn a coroutine get()      1 async_get with a callback token
//   2 spawn a coroutine put(v)     3 async_put(v) with a callback token
//   4 cancel waiter k (terminal/total)
//   5 try_put(v)   6 try_get()   7 task_done()
//   8 shutdown() / shutdown(immediate) / async_join with a callback token
//   9 poll
// After every step size(), getters(), putters(), unfinished_tasks() and
// is_shut_down() must match; after every poll, which waiters completed, how,
// and with which item. At the end the queue is drained: every item put was
// got exactly once (or dropped by an immediate shutdown), every waiter
// completed exactly once, and every join woke.

#include <sluice/queue.hpp>

#include "fuzz.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <vector>

namespace {

using sluice_fuzz::probe;

enum class kind { getter, putter, joiner };
enum class st { pending, waiting, granted, done_ok, done_aborted, done_shut };

struct model_waiter {
  kind k = kind::getter;
  bool coro = false;
  bool cancelled = false;
  bool dropped = false;  // getter: its handed item was dropped by shutdown(immediate)
  st state = st::pending;
  int value = 0;  // getter: the item it got; putter: the item it puts
};

struct model {
  std::size_t maxsize = 0;
  std::deque<int> items;
  std::deque<std::size_t> getters, putters, joiners;
  std::deque<std::size_t> handed;  // getters handed an item, not yet resumed
  std::size_t unfinished = 0;
  bool shut = false;
  std::vector<model_waiter> w;
  std::multiset<int> dropped;  // by shutdown(immediate)
  sluice_fuzz::model_loop loop;

  bool full() const { return maxsize > 0 && items.size() >= maxsize; }
  std::deque<std::size_t>& list_of(kind k) {
    return k == kind::getter ? getters : k == kind::putter ? putters : joiners;
  }

  void complete(std::size_t id, st how) {
    w[id].state = st::granted;
    loop.post([this, id, how] { resume(id, how); });
  }
  // A getter handed an item resumes as a deferred completion: the item may
  // still be dropped by an immediate shutdown until then.
  void hand_over(std::size_t g, int v) {
    w[g].value = v;
    w[g].state = st::granted;
    handed.push_back(g);
    loop.post([this, g] {
      if (auto it = std::find(handed.begin(), handed.end(), g); it != handed.end())
        handed.erase(it);
      resume(g, w[g].dropped ? st::done_shut : st::done_ok);
    });
  }
  void resume(std::size_t id, st how) {
    auto& m = w[id];
    if (m.k == kind::getter && m.coro && m.cancelled && how != st::done_aborted) {
      // get(): woken, then cancelled before it resumed: cancellation wins; an
      // item it received goes back.
      if (how == st::done_ok) give_back(m.value);
      m.state = st::done_aborted;
      return;
    }
    m.state = how;
  }

  bool put_now(int v) {
    if (!getters.empty()) {
      const std::size_t g = getters.front();
      getters.pop_front();
      ++unfinished;
      hand_over(g, v);
      return true;
    }
    if (full()) return false;
    items.push_back(v);
    ++unfinished;
    return true;
  }
  int take_front() {
    const int v = items.front();
    items.pop_front();
    if (!full() && !putters.empty()) {
      const std::size_t p = putters.front();
      putters.pop_front();
      items.push_back(w[p].value);
      ++unfinished;
      complete(p, st::done_ok);
    }
    return v;
  }
  void give_back(int v) {
    if (!getters.empty()) {
      const std::size_t g = getters.front();
      getters.pop_front();
      hand_over(g, v);
      return;
    }
    items.push_front(v);
  }
  void wake_joiners() {
    while (!joiners.empty()) {
      complete(joiners.front(), st::done_ok);
      joiners.pop_front();
    }
  }
  void wait_in(std::size_t id) {
    list_of(w[id].k).push_back(id);
    w[id].state = st::waiting;
  }

  void start_coro_get(std::size_t id) {
    if (!items.empty()) {
      w[id].value = take_front();
      w[id].state = st::done_ok;
    } else if (shut) {
      w[id].state = st::done_shut;
    } else {
      wait_in(id);
    }
  }
  void start_callback_get(std::size_t id) {
    if (!items.empty()) {
      hand_over(id, take_front());
    } else if (shut) {
      complete(id, st::done_shut);
    } else {
      wait_in(id);
    }
  }
  void start_coro_put(std::size_t id) {
    if (shut) {
      w[id].state = st::done_shut;
    } else if (put_now(w[id].value)) {
      w[id].state = st::done_ok;
    } else {
      wait_in(id);
    }
  }
  void start_callback_put(std::size_t id) {
    if (shut) {
      complete(id, st::done_shut);
    } else if (!getters.empty() || !full()) {
      put_now(w[id].value);
      complete(id, st::done_ok);
    } else {
      wait_in(id);
    }
  }
  void start_join(std::size_t id) {
    if (unfinished == 0) {
      complete(id, st::done_ok);
    } else {
      wait_in(id);
    }
  }
  void shutdown(bool now) {
    shut = true;
    if (now) {
      while (!items.empty()) {
        dropped.insert(items.front());
        items.pop_front();
        if (unfinished > 0) --unfinished;
      }
      for (std::size_t g : handed) {
        w[g].dropped = true;
        dropped.insert(w[g].value);
        if (unfinished > 0) --unfinished;
      }
      handed.clear();
      if (unfinished == 0) wake_joiners();
    }
    for (std::size_t id : getters) complete(id, st::done_shut);
    for (std::size_t id : putters) complete(id, st::done_shut);
    getters.clear();
    putters.clear();
  }
  void cancel(std::size_t id, bool terminal) {
    auto& m = w[id];
    if (m.coro) m.cancelled = terminal;
    if (m.state != st::waiting || (m.coro && !terminal)) return;
    auto& l = list_of(m.k);
    l.erase(std::find(l.begin(), l.end(), id));
    complete(id, st::done_aborted);
  }
};

struct real_waiter : probe {
  std::optional<int> got;
};

asio::awaitable<void> get_into(sluice::queue<int>& q, real_waiter* p) {
  p->got = co_await q.get();
}

asio::awaitable<void> put_one(sluice::queue<int>& q, int v) {
  co_await q.put(v);
}

bool shut_error(const real_waiter& p) {
  const sluice::error_code shut = sluice::queue_errc::shut_down;
  return p.coro ? sluice_fuzz::is_error(p.error, shut) : p.ec == shut;
}

void check_done(const std::vector<std::unique_ptr<real_waiter>>& probes, const model& m) {
  for (std::size_t i = 0; i < probes.size(); ++i) {
    const real_waiter& p = *probes[i];
    const model_waiter& x = m.w[i];
    if (sluice_fuzz::trace())
      std::fprintf(stderr, "waiter %zu kind=%d coro=%d model=%d/%d done=%d ok=%d got=%d\n", i,
                   int(x.k), int(p.coro), int(x.state), x.value, int(p.done()), int(p.ok()),
                   p.got ? *p.got : -1);
    FUZZ_CHECK(x.state == st::waiting || x.state == st::done_ok || x.state == st::done_aborted ||
               x.state == st::done_shut);
    FUZZ_CHECK(p.done() == (x.state != st::waiting));
    if (!p.done()) continue;
    FUZZ_CHECK(p.ok() == (x.state == st::done_ok));
    if (x.state == st::done_ok && x.k == kind::getter) FUZZ_CHECK(p.got && *p.got == x.value);
    if (x.state == st::done_shut) FUZZ_CHECK(shut_error(p));
    if (x.state == st::done_aborted)
      FUZZ_CHECK(p.coro ? sluice_fuzz::is_error(p.error, asio::error::operation_aborted)
                        : p.ec == asio::error::operation_aborted);
  }
}

void check(const sluice::queue<int>& q, const model& m) {
  FUZZ_CHECK(q.size() == m.items.size());
  FUZZ_CHECK(q.getters() == m.getters.size());
  FUZZ_CHECK(q.putters() == m.putters.size());
  FUZZ_CHECK(q.unfinished_tasks() == m.unfinished);
  FUZZ_CHECK(q.is_shut_down() == m.shut);
  FUZZ_CHECK(q.full() == m.full());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sluice_fuzz::script in(data, size);
  std::vector<std::unique_ptr<real_waiter>> probes;  // outlive the loop
  sluice::testing::virtual_loop loop;
  model m;
  m.maxsize = in.next() % 4;
  sluice::queue<int> q{loop.get_executor(), m.maxsize};
  int next_value = 1;
  std::multiset<int> put_ok;  // items the real queue accepted (try_put or put)
  std::multiset<int> got;     // items the real queue handed out (try_get or get)

  auto add = [&](kind k, bool coro) {
    probes.push_back(std::make_unique<real_waiter>());
    probes.back()->coro = coro;
    m.w.push_back(model_waiter{k, coro, false, false, st::pending, 0});
    return probes.size() - 1;
  };
  auto poll = [&] {
    loop.poll();
    m.loop.run();
    check_done(probes, m);
  };
  auto on_item = [](real_waiter* p) {
    return [p](sluice::error_code ec, int v) {
      if (!ec) p->got = v;
    };
  };
  auto try_get = [&] {
    std::optional<int> r;
    bool threw = false;
    try {
      r = q.try_get();
    } catch (const sluice::queue_shut_down&) {
      threw = true;
    }
    if (!m.items.empty()) {
      FUZZ_CHECK(r && *r == m.take_front());
      got.insert(*r);
    } else {
      FUZZ_CHECK(!r && threw == m.shut);
    }
  };
  auto try_put = [&] {
    const int v = next_value++;
    bool ok = false, threw = false;
    try {
      ok = q.try_put(v);
    } catch (const sluice::queue_shut_down&) {
      threw = true;
    }
    FUZZ_CHECK(threw == m.shut);
    if (!m.shut) FUZZ_CHECK(ok == m.put_now(v));
    if (ok) put_ok.insert(v);
  };

  while (!in.done() && probes.size() < 64) {
    switch (in.next() % 10) {
      case 0: {
        const std::size_t id = add(kind::getter, true);
        real_waiter* p = probes[id].get();
        sluice_fuzz::spawn(loop.get_executor(), *p, get_into(q, p));
        m.loop.post([&m, id] { m.start_coro_get(id); });
        break;
      }
      case 1: {
        const std::size_t id = add(kind::getter, false);
        q.async_get(sluice_fuzz::callback(*probes[id], on_item(probes[id].get())));
        m.start_callback_get(id);
        break;
      }
      case 2: {
        const std::size_t id = add(kind::putter, true);
        const int v = next_value++;
        m.w[id].value = v;
        sluice_fuzz::spawn(loop.get_executor(), *probes[id], put_one(q, v));
        m.loop.post([&m, id] { m.start_coro_put(id); });
        break;
      }
      case 3: {
        const std::size_t id = add(kind::putter, false);
        const int v = next_value++;
        m.w[id].value = v;
        q.async_put(v, sluice_fuzz::callback(*probes[id]));
        m.start_callback_put(id);
        break;
      }
      case 4: {
        if (auto c = sluice_fuzz::cancel_step(
                in, probes, [&](std::size_t i) { return m.w[i].state != st::pending; }))
          m.cancel(c->first, c->second);
        break;
      }
      case 5:
        try_put();
        break;
      case 6:
        try_get();
        break;
      case 7: {
        bool threw = false;
        try {
          q.task_done();
        } catch (const std::logic_error&) {
          threw = true;
        }
        FUZZ_CHECK(threw == (m.unfinished == 0));
        if (!threw && --m.unfinished == 0) m.wake_joiners();
        break;
      }
      case 8: {
        const std::uint8_t b = in.next() % 4;
        if (b < 2) {
          q.shutdown(b == 1);
          m.shutdown(b == 1);
        } else {
          const std::size_t id = add(kind::joiner, false);
          q.async_join(sluice_fuzz::callback(*probes[id]));
          m.start_join(id);
        }
        break;
      }
      default:
        poll();
        break;
    }
    check(q, m);
  }

  // Drain: take items while putters wait, feed getters while they wait, then
  // take what is left and mark every item done, which wakes every join.
  poll();
  for (int round = 0; round < 200 && !m.putters.empty(); ++round) {
    try_get();
    poll();
  }
  for (int round = 0; round < 200 && !m.getters.empty(); ++round) {
    try_put();
    poll();
  }
  while (!m.items.empty()) try_get();
  poll();
  check(q, m);
  FUZZ_CHECK(m.getters.empty() && m.putters.empty());
  while (m.unfinished > 0) {
    q.task_done();
    if (--m.unfinished == 0) m.wake_joiners();
  }
  poll();
  check(q, m);
  for (const auto& p : probes) FUZZ_CHECK(p->completions == 1);

  // No item lost or duplicated: every item accepted was handed out exactly
  // once or dropped by an immediate shutdown.
  for (std::size_t i = 0; i < probes.size(); ++i) {
    const real_waiter& p = *probes[i];
    if (m.w[i].k == kind::putter && p.ok()) put_ok.insert(m.w[i].value);
    if (m.w[i].k == kind::getter && p.ok()) got.insert(*p.got);
  }
  std::multiset<int> accounted = got;
  accounted.insert(m.dropped.begin(), m.dropped.end());
  FUZZ_CHECK(accounted == put_ok);
  for (int v : put_ok) FUZZ_CHECK(put_ok.count(v) == 1);
  return 0;
}
