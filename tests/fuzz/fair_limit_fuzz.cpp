// SPDX-License-Identifier: BSL-1.0
// Fuzz target: fair_limit<semaphore, std::string>, the gate in front of a
// limit, against a model of what its callers hold and wait for. The order of
// grants between keys is the rotation's (detail/fair_rotation.hpp), which
// fair_semaphore_fuzz checks step for step; here the gate's own work is
// checked: one call at a time in the semaphore's queue, the turn handed on by
// every way a call leaves (granted, cancelled at the gate, cancelled in the
// semaphore, cancelled after its turn came), per-key FIFO, nothing lost.
//
// Byte 0: permits (1..3). Then each step is one byte, plus argument bytes:
//   0 spawn scoped_acquire(key)          1 spawn scoped_acquire(key), pre-cancelled
//   2 cancel waiter k (terminal/total)   3 release holder k
//   4 set_weight(key, 0.25 .. 4)         5 cancel waiter k, then release holder j
//   6..7 poll
// A key is one of three, chosen by the next byte. After every poll (the loop
// idle): no permit is free while a call waits (a lost turn would leave one),
// holders <= permits, free + held == permits, waiters() and every key's
// stats() match the model, grants of a key came in the order its calls
// asked. At the end everything is released and every call completed once.

#include <sluice/fair_limit.hpp>
#include <sluice/semaphore.hpp>

#include "fuzz.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

using gate_type = sluice::fair_limit<sluice::semaphore, std::string>;
const std::array<std::string, 3> key_names{"a", "b", "c"};

struct call {
  sluice_fuzz::probe p;
  std::size_t key = 0;
  std::optional<gate_type::permit> held;
  bool started = false;  // its coroutine has begun (co_spawn from outside the loop posts)
  bool granted = false;
};

asio::awaitable<void> take(gate_type& gate, call& c, std::vector<std::size_t>& order,
                           std::size_t id, bool precancelled) {
  c.started = true;
  if (precancelled) {
    co_await asio::this_coro::throw_if_cancelled(false);
    c.p.signal.emit(asio::cancellation_type::terminal);
  }
  auto permit = co_await gate.scoped_acquire(key_names[c.key]);
  c.granted = true;
  c.held.emplace(std::move(permit));
  order.push_back(id);
}

void check(const gate_type& gate, const std::vector<std::unique_ptr<call>>& calls,
           std::size_t permits, const std::vector<std::size_t>& order) {
  std::array<std::size_t, 3> held{}, waiting{};
  for (const auto& c : calls) {
    if (c->held) ++held[c->key];
    if (!c->p.done() && !c->granted) ++waiting[c->key];
  }
  std::size_t all_held = 0, all_waiting = 0;
  for (std::size_t k = 0; k < 3; ++k) {
    const sluice::fair_share s = gate.stats(key_names[k]);
    FUZZ_CHECK(s.in_use == held[k]);
    FUZZ_CHECK(s.waiting == waiting[k]);
    all_held += held[k];
    all_waiting += waiting[k];
  }
  FUZZ_CHECK(all_held <= permits);
  FUZZ_CHECK(gate.underlying().value() + all_held == permits);
  FUZZ_CHECK(gate.waiters() == all_waiting);
  FUZZ_CHECK(gate.underlying().value() == 0 || all_waiting == 0);  // no turn lost
  std::array<std::size_t, 3> last{};
  std::array<bool, 3> any{};
  for (std::size_t id : order) {  // per-key FIFO
    const std::size_t k = calls[id]->key;
    FUZZ_CHECK(!any[k] || id > last[k]);
    any[k] = true;
    last[k] = id;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sluice_fuzz::script in(data, size);
  std::vector<std::unique_ptr<call>> calls;  // outlive the loop
  std::vector<std::size_t> order;
  sluice::testing::virtual_loop loop;
  const std::size_t permits = 1 + in.next() % 3;
  gate_type gate{sluice::fair_options{.window = 4}, permits};

  auto spawn = [&](bool precancelled) {
    auto c = std::make_unique<call>();
    c->key = in.next() % 3;
    const std::size_t id = calls.size();
    calls.push_back(std::move(c));
    sluice_fuzz::spawn(loop.get_executor(), calls.back()->p,
                       take(gate, *calls.back(), order, id, precancelled));
  };
  auto cancel = [&] {
    if (calls.empty()) return;
    call& c = *calls[in.next() % calls.size()];
    // Only a call whose coroutine has begun, as sluice_fuzz::cancel_step: one
    // cancelled before its first step never reaches the gate, and Boost.Asio
    // 1.81's co_spawn cannot end it (see sluice_fuzz::spawn).
    if (c.started && !c.p.done() && !c.granted)
      c.p.signal.emit(sluice_fuzz::cancellation_of(in.next()));
  };
  auto release = [&] {
    if (calls.empty()) return;
    call& c = *calls[in.next() % calls.size()];
    c.held.reset();
  };
  while (!in.done()) {
    switch (in.next() % 8) {
      case 0:
        spawn(false);
        break;
      case 1:
        spawn(true);
        break;
      case 2:
        cancel();
        break;
      case 3:
        release();
        break;
      case 4: {
        const std::size_t key = in.next() % 3;
        gate.set_weight(key_names[key], 0.25 * double(1 + in.next() % 16));
        break;
      }
      case 5:
        cancel();
        release();
        break;
      default:
        loop.poll();
        check(gate, calls, permits, order);
    }
  }
  loop.poll();
  check(gate, calls, permits, order);
  for (auto& c : calls)
    if (!c->p.done() && !c->granted) c->p.signal.emit(asio::cancellation_type::terminal);
  loop.poll();
  for (auto& c : calls) c->held.reset();
  loop.poll();
  for (const auto& c : calls) FUZZ_CHECK(c->p.completions == 1);
  FUZZ_CHECK(gate.underlying().value() == permits);  // no permit lost
  FUZZ_CHECK(gate.waiters() == 0);
  FUZZ_CHECK(gate.keys() <= 4);  // only keys among the last 4 grants keep an entry
  return 0;
}
