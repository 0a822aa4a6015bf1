// SPDX-License-Identifier: BSL-1.0
// Fuzz target: keyed_semaphore against a reference model: per key, a counter
// and a FIFO list of waiters; keys() counts the keys held or waited for.
//
// Byte 0: per_key (1..3). Then each step is one byte, plus argument bytes:
//   0 spawn a coroutine acquire(key)    1 async_acquire(key) with a callback token
//   2 cancel waiter k (terminal/total)  3 release (by holder k, or of an idle key)
//   4 try_acquire(key)                  5..7 poll
// A key is one of three, chosen by the next byte. After every step value(),
// waiters() of every key and keys() must match the model; after every poll,
// which waiters completed and how. At the end everything is released: every
// waiter completed exactly once, no permit was lost and no entry is left.

#include <sluice/keyed_semaphore.hpp>

#include "fuzz.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using sluice_fuzz::probe;
using keyed = sluice::keyed_semaphore<std::string>;

const std::array<std::string, 3> key_names{"a", "b", "c"};

enum class st { pending, waiting, granted, aborted, held, released, done_aborted };

struct model_waiter {
  std::size_t key = 0;
  bool coro = false;
  bool cancelled = false;
  st state = st::pending;
};

struct model {
  std::size_t per_key = 1;
  std::array<std::size_t, 3> value{};
  std::array<std::deque<std::size_t>, 3> fifo;
  std::vector<model_waiter> w;
  std::array<std::size_t, 3> anonymous{};  // permits held through try_acquire
  sluice_fuzz::model_loop loop;

  bool idle(std::size_t k) const { return value[k] == per_key && fifo[k].empty(); }
  std::size_t keys() const {
    std::size_t n = 0;
    for (std::size_t k = 0; k < 3; ++k) n += !idle(k);
    return n;
  }
  void release(std::size_t k) {
    if (!fifo[k].empty()) {
      const std::size_t id = fifo[k].front();
      fifo[k].pop_front();
      w[id].state = st::granted;
      loop.post([this, id] { resume_granted(id); });
      return;
    }
    ++value[k];
  }
  void resume_granted(std::size_t id) {
    if (w[id].coro && w[id].cancelled) {
      w[id].state = st::done_aborted;
      release(w[id].key);
      return;
    }
    w[id].state = st::held;
  }
  void initiate(std::size_t id) {
    const std::size_t k = w[id].key;
    if (value[k] > 0 && fifo[k].empty()) {
      --value[k];
      if (w[id].coro) {
        w[id].state = st::held;
      } else {
        w[id].state = st::granted;
        loop.post([this, id] { w[id].state = st::held; });
      }
      return;
    }
    fifo[k].push_back(id);
    w[id].state = st::waiting;
  }
  void cancel(std::size_t id, bool terminal) {
    auto& m = w[id];
    if (m.coro) m.cancelled = terminal;
    if (m.state != st::waiting || (m.coro && !terminal)) return;
    auto& f = fifo[m.key];
    f.erase(std::find(f.begin(), f.end(), id));
    m.state = st::aborted;
    loop.post([this, id] { w[id].state = st::done_aborted; });
  }
};

void check(const keyed& s, const model& m) {
  for (std::size_t k = 0; k < 3; ++k) {
    FUZZ_CHECK(s.value(key_names[k]) == m.value[k]);
    FUZZ_CHECK(s.waiters(key_names[k]) == m.fifo[k].size());
  }
  FUZZ_CHECK(s.keys() == m.keys());
}

void check_done(const std::vector<std::unique_ptr<probe>>& probes, const model& m) {
  for (std::size_t i = 0; i < probes.size(); ++i) {
    const probe& p = *probes[i];
    const st s = m.w[i].state;
    if (sluice_fuzz::trace())
      std::fprintf(stderr, "waiter %zu key=%zu coro=%d model=%d done=%d ok=%d\n", i, m.w[i].key,
                   int(p.coro), int(s), int(p.done()), int(p.ok()));
    FUZZ_CHECK(s == st::waiting || s == st::held || s == st::released || s == st::done_aborted);
    FUZZ_CHECK(p.done() == (s != st::waiting));
    if (!p.done()) continue;
    FUZZ_CHECK(p.ok() == (s != st::done_aborted));
    if (!p.ok())
      FUZZ_CHECK(p.coro ? sluice_fuzz::is_error(p.error, asio::error::operation_aborted)
                        : p.ec == asio::error::operation_aborted);
  }
}

asio::awaitable<void> acquire_key(keyed& s, std::string key) {
  co_await s.acquire(key);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sluice_fuzz::script in(data, size);
  std::vector<std::unique_ptr<probe>> probes;  // outlive the loop
  sluice::testing::virtual_loop loop;
  model m;
  m.per_key = 1 + in.next() % 3;
  m.value.fill(m.per_key);
  keyed sem{loop.get_executor(), m.per_key};
  std::array<std::vector<keyed::permit>, 3> permits;  // try_acquire's, per key

  auto add = [&](std::size_t key, bool coro) {
    probes.push_back(std::make_unique<probe>());
    probes.back()->coro = coro;
    m.w.push_back(model_waiter{key, coro, false, st::pending});
    return probes.size() - 1;
  };
  auto poll = [&] {
    loop.poll();
    m.loop.run();
    check_done(probes, m);
  };
  // Releases holder k (a waiter that holds, or a try_acquire permit), or, past
  // the holders, releases an idle key, which must throw.
  auto release = [&](std::uint8_t b, std::uint8_t key_byte) {
    std::vector<std::size_t> holders;
    for (std::size_t i = 0; i < m.w.size(); ++i)
      if (m.w[i].state == st::held) holders.push_back(i);
    std::size_t anonymous = 0;
    for (const auto& v : permits) anonymous += v.size();
    const std::size_t k = b % (holders.size() + anonymous + 1);
    if (k < holders.size()) {
      const std::size_t key = m.w[holders[k]].key;
      sem.release(key_names[key]);
      m.w[holders[k]].state = st::released;
      m.release(key);
    } else if (k < holders.size() + anonymous) {
      std::size_t j = k - holders.size(), key = 0;
      while (j >= permits[key].size()) j -= permits[key++].size();
      permits[key].erase(permits[key].begin() + static_cast<std::ptrdiff_t>(j));  // releases
      m.release(key);
    } else {
      const std::size_t key = key_byte % 3;
      if (!m.idle(key)) return;  // releasing a held key for nobody would be misuse
      bool threw = false;
      try {
        sem.release(key_names[key]);
      } catch (const std::logic_error&) {
        threw = true;
      }
      FUZZ_CHECK(threw);
    }
  };

  while (!in.done() && probes.size() < 64) {
    switch (in.next() % 8) {
      case 0: {
        const std::size_t id = add(in.next() % 3, true);
        sluice_fuzz::spawn(loop.get_executor(), *probes[id],
                           acquire_key(sem, key_names[m.w[id].key]));
        m.loop.post([&m, id] { m.initiate(id); });
        break;
      }
      case 1: {
        const std::size_t id = add(in.next() % 3, false);
        sem.async_acquire(key_names[m.w[id].key], sluice_fuzz::callback(*probes[id]));
        m.initiate(id);
        break;
      }
      case 2:
        if (auto c = sluice_fuzz::cancel_step(
                in, probes, [&](std::size_t i) { return m.w[i].state != st::pending; }))
          m.cancel(c->first, c->second);
        break;
      case 3: {
        const std::uint8_t b = in.next();
        release(b, in.next());
        break;
      }
      case 4: {
        const std::size_t key = in.next() % 3;
        std::optional<keyed::permit> p = sem.try_acquire(key_names[key]);
        const bool expect = m.value[key] > 0 && m.fifo[key].empty();
        FUZZ_CHECK(p.has_value() == expect);
        if (p) {
          FUZZ_CHECK(p->key() == key_names[key]);
          permits[key].push_back(std::move(*p));
          --m.value[key];
        }
        break;
      }
      default:
        poll();
        break;
    }
    check(sem, m);
  }

  // Drain: release every holder until nobody waits, then every permit.
  poll();
  for (int round = 0; round < 1000; ++round) {
    bool waiting = false;
    for (const auto& f : m.fifo) waiting = waiting || !f.empty();
    if (!waiting) break;
    release(0, 0);
    poll();
    check(sem, m);
  }
  for (std::size_t i = 0; i < m.w.size(); ++i)
    if (m.w[i].state == st::held) release(0, 0);
  for (std::size_t key = 0; key < 3; ++key) {
    while (!permits[key].empty()) {
      permits[key].pop_back();
      m.release(key);
    }
  }
  poll();
  check(sem, m);
  FUZZ_CHECK(sem.keys() == 0);  // no entry left behind
  for (std::size_t k = 0; k < 3; ++k) FUZZ_CHECK(m.value[k] == m.per_key);
  for (const auto& p : probes) FUZZ_CHECK(p->completions == 1);
  return 0;
}
