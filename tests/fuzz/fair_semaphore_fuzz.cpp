// SPDX-License-Identifier: BSL-1.0
// Fuzz target: fair_semaphore against a reference model: a pool of permits,
// a FIFO list of waiters per key, and the deficit round robin over the keys
// with waiters (keys stay in the rotation until their turn comes, as in the
// implementation, so a key whose waiters were cancelled keeps its place).
//
// Byte 0: permits (1..3). Then each step is one byte, plus argument bytes:
//   0 spawn a coroutine acquire(key)    1 async_acquire(key) with a callback token
//   2 cancel waiter k (terminal/total)  3 release (by holder k, or of an idle key)
//   4 try_acquire(key)                  5 set_weight(key, 0.25 .. 4)
//   6..7 poll
// A key is one of three, chosen by the next byte. After every step value(),
// waiters() of every key and each key's in_use must match the model; after
// every poll, which waiters completed and how (so the order of grants between
// keys is the model's). At the end everything is released: every waiter
// completed exactly once and no permit was lost.

#include <sluice/fair_semaphore.hpp>

#include "keyed_driver.hpp"

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
using sluice_fuzz::keyed::key_names;
using sluice_fuzz::keyed::model_waiter;
using sluice_fuzz::keyed::st;
using keyed = sluice::fair_semaphore<std::string>;

struct model : sluice_fuzz::keyed::model_base<model> {
  std::size_t free = 1;
  std::array<std::size_t, 3> in_use{};
  std::array<double, 3> weight{1.0, 1.0, 1.0}, deficit{};
  std::array<bool, 3> active{};
  std::deque<std::size_t> rotation;

  bool idle(std::size_t k) const { return in_use[k] == 0; }
  bool can_take(std::size_t) const { return free > 0; }
  void take(std::size_t k) {
    --free;
    ++in_use[k];
  }
  void grant(std::size_t id) {
    ++in_use[w[id].key];
    grant_waiter(id);
  }
  // fair_semaphore::hand_on, step for step.
  void hand_on() {
    while (!rotation.empty()) {
      const std::size_t k = rotation.front();
      if (fifo[k].empty()) {
        rotation.pop_front();
        active[k] = false;
        deficit[k] = 0;
        continue;
      }
      if (deficit[k] < 1.0) {
        deficit[k] += weight[k];
        if (deficit[k] < 1.0) {
          rotation.pop_front();
          rotation.push_back(k);
          continue;
        }
      }
      deficit[k] -= 1.0;
      const std::size_t id = fifo[k].front();
      fifo[k].pop_front();
      grant(id);
      if (deficit[k] < 1.0 || fifo[k].empty()) {
        rotation.pop_front();
        if (!fifo[k].empty()) {
          rotation.push_back(k);
        } else {
          active[k] = false;
          deficit[k] = 0;
        }
      }
      return;
    }
    ++free;
  }
  void release(std::size_t k) {
    --in_use[k];
    hand_on();
  }
  void initiate(std::size_t id) {
    const std::size_t k = w[id].key;
    if (free > 0) {
      --free;
      ++in_use[k];
      if (w[id].coro) {
        w[id].state = st::held;
      } else {
        w[id].state = st::granted;
        loop.post([this, id] { w[id].state = st::held; });
      }
      return;
    }
    if (!active[k]) {
      active[k] = true;
      rotation.push_back(k);
    }
    fifo[k].push_back(id);
    w[id].state = st::waiting;
  }
};

void check(const keyed& s, const model& m) {
  FUZZ_CHECK(s.value() == m.free);
  std::size_t waiting = 0;
  for (std::size_t k = 0; k < 3; ++k) {
    FUZZ_CHECK(s.waiters(key_names[k]) == m.fifo[k].size());
    FUZZ_CHECK(s.stats(key_names[k]).in_use == m.in_use[k]);
    waiting += m.fifo[k].size();
  }
  FUZZ_CHECK(s.waiters() == waiting);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sluice_fuzz::script in(data, size);
  std::vector<std::unique_ptr<probe>> probes;  // outlive the loop
  sluice::testing::virtual_loop loop;
  model m;
  const std::size_t permits_total = 1 + in.next() % 3;
  m.free = permits_total;
  keyed sem{loop.get_executor(), permits_total, {.window = 4}};

  sluice_fuzz::keyed::run(in, loop, sem, m, probes, check, [&](sluice_fuzz::script& steps) {
    const std::size_t key = steps.next() % 3;
    const double weight = 0.25 * double(1 + steps.next() % 16);
    sem.set_weight(key_names[key], weight);
    m.weight[key] = weight;
    return true;
  });

  FUZZ_CHECK(sem.value() == permits_total);  // no permit lost
  FUZZ_CHECK(m.free == permits_total);
  for (const auto& p : probes) FUZZ_CHECK(p->completions == 1);
  return 0;
}
