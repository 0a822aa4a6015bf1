// SPDX-License-Identifier: BSL-1.0
// The step loop shared by the fuzz targets of limits with a key per waiter
// (keyed_semaphore, fair_semaphore), against the target's reference model.
//
// Each step is one byte, plus argument bytes:
//   0 spawn a coroutine acquire(key)    1 async_acquire(key) with a callback token
//   2 cancel waiter k (terminal/total)  3 release (by holder k, or of an idle key)
//   4 try_acquire(key)                  5 the target's own step (`extra`; none: poll)
//   6..7 poll
// A key is one of three, chosen by the next byte. After every step
// `check(sem, model)`; after every poll, which waiters completed and how. At
// the end everything is released (the target then checks that nothing is
// left). The model provides w (model_waiter per probe), fifo (per key),
// loop, initiate(id), cancel(id, terminal), release(key), idle(key),
// can_take(key) and take(key) (try_acquire).
#ifndef SLUICE_TESTS_FUZZ_KEYED_DRIVER_HPP
#define SLUICE_TESTS_FUZZ_KEYED_DRIVER_HPP

#include "fuzz.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace sluice_fuzz::keyed {

inline const std::array<std::string, 3> key_names{"a", "b", "c"};

enum class st { pending, waiting, granted, aborted, held, released, done_aborted };

struct model_waiter {
  std::size_t key = 0;
  bool coro = false;
  bool cancelled = false;
  st state = st::pending;
};

// What every keyed model shares: the waiters, a FIFO of waiter ids per key,
// the mirror of the loop's posts, and what a grant, a cancellation and a
// granted coroutine's resumption do. Derived (CRTP) provides release(key).
template <class Derived>
struct model_base {
  std::array<std::deque<std::size_t>, 3> fifo;
  std::vector<model_waiter> w;
  model_loop loop;

  // Waiter id was handed a permit; it resumes in a post.
  void grant_waiter(std::size_t id) {
    w[id].state = st::granted;
    loop.post([this, id] { resume_granted(id); });
  }
  void resume_granted(std::size_t id) {
    if (w[id].coro && w[id].cancelled) {
      w[id].state = st::done_aborted;
      static_cast<Derived&>(*this).release(w[id].key);
      return;
    }
    w[id].state = st::held;
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

template <class Model>
void check_done(const std::vector<std::unique_ptr<probe>>& probes, const Model& m) {
  for (std::size_t i = 0; i < probes.size(); ++i) {
    const probe& p = *probes[i];
    const st s = m.w[i].state;
    if (trace())
      std::fprintf(stderr, "waiter %zu key=%zu coro=%d model=%d done=%d ok=%d\n", i, m.w[i].key,
                   int(p.coro), int(s), int(p.done()), int(p.ok()));
    FUZZ_CHECK(s == st::waiting || s == st::held || s == st::released || s == st::done_aborted);
    FUZZ_CHECK(p.done() == (s != st::waiting));
    if (!p.done()) continue;
    FUZZ_CHECK(p.ok() == (s != st::done_aborted));
    if (!p.ok())
      FUZZ_CHECK(p.coro ? is_error(p.error, asio::error::operation_aborted)
                        : p.ec == asio::error::operation_aborted);
  }
}

template <class Sem>
asio::awaitable<void> acquire_key(Sem& s, std::string key) {
  co_await s.acquire(key);
}

template <class Sem, class Model, class Check, class Extra>
void run(script& in, sluice::testing::virtual_loop& loop, Sem& sem, Model& m,
         std::vector<std::unique_ptr<probe>>& probes, Check check, Extra extra) {
  std::array<std::vector<typename Sem::permit>, 3> permits;  // try_acquire's, per key

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
        spawn(loop.get_executor(), *probes[id], acquire_key(sem, key_names[m.w[id].key]));
        m.loop.post([&m, id] { m.initiate(id); });
        break;
      }
      case 1: {
        const std::size_t id = add(in.next() % 3, false);
        sem.async_acquire(key_names[m.w[id].key], callback(*probes[id]));
        m.initiate(id);
        break;
      }
      case 2:
        if (auto c =
                cancel_step(in, probes, [&](std::size_t i) { return m.w[i].state != st::pending; }))
          m.cancel(c->first, c->second);
        break;
      case 3: {
        const std::uint8_t b = in.next();
        release(b, in.next());
        break;
      }
      case 4: {
        const std::size_t key = in.next() % 3;
        std::optional<typename Sem::permit> p = sem.try_acquire(key_names[key]);
        FUZZ_CHECK(p.has_value() == m.can_take(key));
        if (p) {
          FUZZ_CHECK(p->key() == key_names[key]);
          permits[key].push_back(std::move(*p));
          m.take(key);
        }
        break;
      }
      case 5:
        if (!extra(in)) poll();
        break;
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
}

}  // namespace sluice_fuzz::keyed

#endif  // SLUICE_TESTS_FUZZ_KEYED_DRIVER_HPP
