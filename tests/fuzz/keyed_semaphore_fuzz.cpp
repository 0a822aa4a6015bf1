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
using keyed = sluice::keyed_semaphore<std::string>;

struct model : sluice_fuzz::keyed::model_base<model> {
  std::size_t per_key = 1;
  std::array<std::size_t, 3> value{};
  std::array<std::size_t, 3> anonymous{};  // permits held through try_acquire

  bool idle(std::size_t k) const { return value[k] == per_key && fifo[k].empty(); }
  bool can_take(std::size_t k) const { return value[k] > 0 && fifo[k].empty(); }
  void take(std::size_t k) { --value[k]; }
  std::size_t keys() const {
    std::size_t n = 0;
    for (std::size_t k = 0; k < 3; ++k) n += !idle(k);
    return n;
  }
  void release(std::size_t k) {
    if (!fifo[k].empty()) {
      const std::size_t id = fifo[k].front();
      fifo[k].pop_front();
      grant_waiter(id);
      return;
    }
    ++value[k];
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
};

void check(const keyed& s, const model& m) {
  for (std::size_t k = 0; k < 3; ++k) {
    FUZZ_CHECK(s.value(key_names[k]) == m.value[k]);
    FUZZ_CHECK(s.waiters(key_names[k]) == m.fifo[k].size());
  }
  FUZZ_CHECK(s.keys() == m.keys());
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

  sluice_fuzz::keyed::run(in, loop, sem, m, probes, check,
                          [](sluice_fuzz::script&) { return false; });

  FUZZ_CHECK(sem.keys() == 0);  // no entry left behind
  for (std::size_t k = 0; k < 3; ++k) FUZZ_CHECK(m.value[k] == m.per_key);
  for (const auto& p : probes) FUZZ_CHECK(p->completions == 1);
  return 0;
}
