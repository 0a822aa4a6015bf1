// SPDX-License-Identifier: BSL-1.0
// Fuzz target: keyed_task_group (the by_key rule for spawned children)
// against a reference model: per-key FIFO queues outside the slots, a slot
// to the child whose key has room and whose oldest child was queued first,
// the producers of spawn_when_ready admitted in FIFO order while fewer than
// `buffer` children wait, and fail fast.
//
// Bytes 0-2: limit (1..4), per_key (1..3), buffer (1..4). Then each step is
// one byte, plus argument bytes (a key is one of four, by the next byte):
//   0 spawn(key, child)          1 spawn_when_ready(key, child) from a producer
//   2 end running child k        3 cancel producer k (terminal; total is filtered out)
//   4 fail running child k (the group stops; the script ends)
//   5..7 nothing (the loop is polled after every step anyway)
// Children check on start that neither the limit nor their key's limit is
// exceeded (no slot is held by a child waiting for its key). After every step
// and poll: which children started (per key, in the model's order), running(),
// waiting(), keys() and producers_waiting() match the model. At the end every
// child frame was destroyed exactly once, every producer completed exactly
// once (true, false or operation_aborted as the model says), the run once.

#include <sluice/event.hpp>
#include <sluice/keyed_task_group.hpp>

#include "fuzz.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

namespace {

using sluice_fuzz::probe;
using group = sluice::keyed_task_group<int>;
constexpr std::size_t key_count = 4;

struct kid {
  int key = 0;
  bool started = false, ended = false, cancelled = false, fail = false;
  int destroyed = 0;
  sluice::event gate;
};

struct producer {
  std::size_t child = 0;
  probe p;
  int result = -1;  // 1 accepted, 0 refused, -1 not (yet) returned
};

struct harness {
  std::size_t limit = 1, per_key = 1, buffer = 1;
  std::vector<std::unique_ptr<kid>> kids;
  std::vector<std::unique_ptr<producer>> producers;
  std::array<std::size_t, key_count> running{};
  std::size_t total = 0;
  std::array<std::vector<std::size_t>, key_count> started;  // per key, in start order
  group* g = nullptr;
  sluice::event end;
};

// Counts the destruction of the frame that holds it (moved-from: nothing).
struct guard {
  harness* h;
  std::size_t id;
  guard(harness* hh, std::size_t i) : h(hh), id(i) {}
  guard(guard&& o) noexcept : h(std::exchange(o.h, nullptr)), id(o.id) {}
  guard& operator=(guard&&) = delete;
  ~guard() {
    if (h != nullptr) ++h->kids[id]->destroyed;
  }
};

asio::awaitable<void> child(harness& h, std::size_t id, guard) {
  kid& k = *h.kids[id];
  const auto key = static_cast<std::size_t>(k.key);
  FUZZ_CHECK(!k.started);
  k.started = true;
  h.started[key].push_back(id);
  FUZZ_CHECK(++h.running[key] <= h.per_key);
  FUZZ_CHECK(++h.total <= h.limit);
  try {
    co_await k.gate.wait();
  } catch (...) {
    --h.running[key];
    --h.total;
    k.cancelled = true;
    throw;
  }
  --h.running[key];
  --h.total;
  k.ended = true;
  if (k.fail) throw std::runtime_error("child failed");
}

asio::awaitable<void> produce(harness& h, producer& p) {
  const int key = h.kids[p.child]->key;
  const bool ok = co_await h.g->spawn_when_ready(key, child(h, p.child, guard(&h, p.child)));
  p.result = ok ? 1 : 0;
}

// The reference: what should have started, waited, been admitted.
struct model {
  std::size_t limit = 1, per_key = 1, buffer = 1;
  std::array<std::deque<std::pair<std::uint64_t, std::size_t>>, key_count> queue;  // (seq, child)
  std::array<std::size_t, key_count> running{};
  std::size_t total = 0, buffered = 0;
  std::uint64_t seq = 0;
  std::deque<std::size_t> producers;  // waiting, FIFO
  std::vector<int> producer_result;   // 1, 0, 2 = aborted, -1 waiting
  std::array<std::vector<std::size_t>, key_count> started;
  std::vector<int> key_of;
  std::vector<std::size_t> producer_child;
  bool stopped = false;

  void push(std::size_t c) {
    queue[static_cast<std::size_t>(key_of[c])].emplace_back(seq++, c);
    ++buffered;
  }
  void fill() {
    if (stopped) return;
    for (;;) {
      while (!producers.empty() && buffered < buffer) {
        const std::size_t p = producers.front();
        producers.pop_front();
        producer_result[p] = 1;
        push(producer_child[p]);
      }
      if (total >= limit) return;
      std::size_t best = key_count;
      for (std::size_t k = 0; k < key_count; ++k)
        if (running[k] < per_key && !queue[k].empty() &&
            (best == key_count || queue[k].front().first < queue[best].front().first))
          best = k;
      if (best == key_count) return;
      const std::size_t c = queue[best].front().second;
      queue[best].pop_front();
      --buffered;
      ++running[best];
      ++total;
      started[best].push_back(c);
    }
  }
  [[nodiscard]] std::size_t keys() const {
    std::size_t n = 0;
    for (std::size_t k = 0; k < key_count; ++k) n += (running[k] > 0 || !queue[k].empty()) ? 1 : 0;
    return n;
  }
};

}  // namespace

namespace {

// (Not in the extern "C" function itself: g++ 12 names its coroutine
// lambdas' symbols twice there.)
void run_script(const std::uint8_t* data, std::size_t size) {
  sluice_fuzz::script in(data, size);
  sluice::testing::virtual_loop loop;
  harness h;
  h.limit = 1 + in.next() % 4;
  h.per_key = 1 + in.next() % 3;
  h.buffer = 1 + in.next() % 4;
  model m;
  m.limit = h.limit;
  m.per_key = h.per_key;
  m.buffer = h.buffer;
  probe run;
  sluice_fuzz::spawn(loop.get_executor(), run,
                     group::run(h.limit, h.per_key,
                                [&](group& g) -> asio::awaitable<void> {
                                  h.g = &g;
                                  co_await h.end.wait();
                                },
                                {.buffer = h.buffer}));
  loop.poll();
  FUZZ_CHECK(h.g != nullptr);

  auto new_kid = [&](int key) {
    h.kids.push_back(std::make_unique<kid>());
    h.kids.back()->key = key;
    m.key_of.push_back(key);
    return h.kids.size() - 1;
  };
  // The children running now, in the model (the real ones must match).
  auto running_kids = [&] {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < h.kids.size(); ++i)
      if (h.kids[i]->started && !h.kids[i]->ended && !h.kids[i]->cancelled) out.push_back(i);
    return out;
  };
  auto compare = [&] {
    for (std::size_t k = 0; k < key_count; ++k) FUZZ_CHECK(h.started[k] == m.started[k]);
    if (m.stopped || h.g == nullptr) return;
    FUZZ_CHECK(h.g->running() == m.total);
    FUZZ_CHECK(h.g->waiting() == m.buffered);
    FUZZ_CHECK(h.g->keys() == m.keys());
    FUZZ_CHECK(h.g->producers_waiting() == m.producers.size());
    for (std::size_t p = 0; p < h.producers.size(); ++p)
      if (m.producer_result[p] != -1 && m.producer_result[p] != 2)
        FUZZ_CHECK(h.producers[p]->result == m.producer_result[p]);
  };

  while (!in.done() && !m.stopped) {
    const int step = in.next() % 8;
    switch (step) {
      case 0: {  // spawn(key, child)
        const int key = in.next() % key_count;
        const std::size_t c = new_kid(key);
        FUZZ_CHECK(h.g->spawn(key, child(h, c, guard(&h, c))));
        m.push(c);
        m.fill();
        break;
      }
      case 1: {  // spawn_when_ready(key, child) from a producer of its own
        const int key = in.next() % key_count;
        const std::size_t c = new_kid(key);
        h.producers.push_back(std::make_unique<producer>());
        producer& p = *h.producers.back();
        p.child = c;
        m.producer_child.push_back(c);
        m.producer_result.push_back(-1);
        const std::size_t id = h.producers.size() - 1;
        if (m.producers.empty() && m.buffered < m.buffer) {
          m.producer_result[id] = 1;
          m.push(c);
          m.fill();
        } else {
          m.producers.push_back(id);
        }
        sluice_fuzz::spawn(loop.get_executor(), p.p, produce(h, p));
        break;
      }
      case 2:
      case 4: {  // end (2) or fail (4) running child k
        const bool fail = step == 4;
        const auto r = running_kids();
        if (r.empty()) break;
        const std::size_t c = r[in.next() % r.size()];
        const auto key = static_cast<std::size_t>(h.kids[c]->key);
        h.kids[c]->fail = fail;
        h.kids[c]->gate.set();
        --m.running[key];
        --m.total;
        if (fail) {
          m.stopped = true;
        } else {
          m.fill();
        }
        break;
      }
      case 3: {  // cancel producer k
        if (h.producers.empty()) break;
        const std::size_t id = in.next() % h.producers.size();
        const auto type = sluice_fuzz::cancellation_of(in.next());
        if (h.producers[id]->p.done()) break;
        h.producers[id]->p.signal.emit(type);
        // A coroutine lets only terminal cancellation through (Asio's default
        // filter): a total one leaves the producer waiting.
        auto it = std::find(m.producers.begin(), m.producers.end(), id);
        if (type == asio::cancellation_type::terminal && it != m.producers.end()) {
          m.producers.erase(it);
          m.producer_result[id] = 2;
        }
        break;
      }
      default:
        break;
    }
    loop.poll();
    compare();
  }
  if (!m.stopped) {
    // End every child, oldest running first, until none is left: each end
    // lets the next ones start, and the waiting producers in.
    for (auto r = running_kids(); !r.empty(); r = running_kids()) {
      for (std::size_t c : r) {
        h.kids[c]->gate.set();
        --m.running[static_cast<std::size_t>(h.kids[c]->key)];
        --m.total;
        m.fill();
      }
      loop.poll();
      compare();
    }
    FUZZ_CHECK(m.producers.empty());
    FUZZ_CHECK(m.buffered == 0);
    h.end.set();
  } else {
    // Fail fast: the running children are cancelled, the waiting ones
    // dropped unstarted, the waiting producers refused.
    for (std::size_t id : m.producers) m.producer_result[id] = 0;
  }
  loop.poll();
  FUZZ_CHECK(run.done());
  h.g = nullptr;  // gone with the run
  compare();
  if (m.stopped) {
    FUZZ_CHECK(run.error != nullptr);
    FUZZ_CHECK(!sluice_fuzz::is_error(run.error, asio::error::operation_aborted));
  } else {
    FUZZ_CHECK(run.error == nullptr);
  }
  std::vector<bool> withdrawn(h.kids.size());  // children of cancelled producers
  for (std::size_t id = 0; id < h.producers.size(); ++id)
    if (m.producer_result[id] == 2) withdrawn[m.producer_child[id]] = true;
  for (std::size_t c = 0; c < h.kids.size(); ++c) {
    const kid& k = *h.kids[c];
    FUZZ_CHECK(k.destroyed == 1);  // nothing lost, nothing run twice
    FUZZ_CHECK(!k.started || k.ended || k.cancelled);
    if (!m.stopped) FUZZ_CHECK(k.started == !withdrawn[c]);
  }
  for (std::size_t id = 0; id < h.producers.size(); ++id) {
    const producer& p = *h.producers[id];
    FUZZ_CHECK(p.p.done());
    if (m.producer_result[id] == 2) {
      FUZZ_CHECK(sluice_fuzz::is_error(p.p.error, asio::error::operation_aborted));
    } else {
      FUZZ_CHECK(p.p.error == nullptr);
      FUZZ_CHECK(p.result == m.producer_result[id]);
    }
  }
  FUZZ_CHECK(h.total == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  run_script(data, size);
  return 0;
}
