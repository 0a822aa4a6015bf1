// SPDX-License-Identifier: BSL-1.0
#include <sluice/by_key.hpp>
#include <sluice/for_each.hpp>
#include <sluice/gather.hpp>
#include <sluice/keyed_rate_limiter.hpp>
#include <sluice/keyed_semaphore.hpp>
#include <sluice/keyed_task_group.hpp>
#include <sluice/progress.hpp>
#include <sluice/stop_source.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>
#include <sluice/timeout.hpp>

#include <support/asio.hpp>

#include <examples/support/crawl_scenario.hpp>

#include <catch2/catch.hpp>
#include <support/lazy_tasks.hpp>
#include <support/recorded_input.hpp>
#include <support/spawned.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::virtual_loop;
using sluice_test::recorded_input;
using sluice_test::recorded_source;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace {

// One input: its key, how long its task takes, and its index.
struct job {
  char key;
  nanoseconds took;
  int id;
};

// What the tasks did: each start (id, when), and the most in flight overall
// and per key at any instant.
struct trace {
  std::vector<std::pair<int, nanoseconds>> starts;
  std::map<char, std::vector<int>> order;  // ids per key, in start order
  std::map<char, std::size_t> running, max_running;
  std::size_t now = 0, max = 0, finished = 0, cancelled = 0;
};

asio::awaitable<int> work(virtual_loop& loop, trace& t, job j) {
  t.starts.emplace_back(j.id, loop.now());
  t.order[j.key].push_back(j.id);
  t.max = std::max(t.max, ++t.now);
  t.max_running[j.key] = std::max(t.max_running[j.key], ++t.running[j.key]);
  try {
    co_await sluice::sleep(j.took);
  } catch (...) {
    --t.now;
    --t.running[j.key];
    ++t.cancelled;
    throw;
  }
  --t.now;
  --t.running[j.key];
  ++t.finished;
  if (j.took == 13ms) throw std::runtime_error("job " + std::to_string(j.id) + " failed");
  co_return j.id;
}

std::vector<job> jobs(const std::string& keys, milliseconds each) {
  std::vector<job> out;
  for (int i = 0; i < static_cast<int>(keys.size()); ++i) out.push_back({keys[i], each, i});
  return out;
}

const auto key_of = [](const job& j) {
  return j.key;
};

nanoseconds started(const trace& t, int id) {
  for (auto& [i, at] : t.starts)
    if (i == id) return at;
  return nanoseconds(-1);
}

}  // namespace

TEST_CASE("a slot goes to the oldest input whose key has room, not to one that would wait",
          "[by_key]") {
  // aaaa b c, limit 2, one per key: b and c start at once beside the first a;
  // the a's run one after another: done at 4 x 100 ms, the ideal.
  virtual_loop loop;
  trace t;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(
        sluice::map_unordered([&](job j) { return work(loop, t, j); }, jobs("aaaabc", 100ms), 2,
                              sluice::by_key(key_of, 1)),
        [](int) {});
  });
  CHECK(loop.now() == 400ms);
  CHECK(started(t, 4) == 0ms);    // b: beside the first a
  CHECK(started(t, 5) == 100ms);  // c: the next free slot, not after the a's
  CHECK(t.order['a'] == std::vector<int>{0, 1, 2, 3});
  CHECK(t.max == 2);
  CHECK(t.max_running['a'] == 1);
}

TEST_CASE("without keys a task waiting for its key holds a slot: the head-of-line figure",
          "[by_key]") {
  // The same input through a keyed_semaphore inside the task: b and c wait
  // behind the a's that hold the slots while they wait for "a".
  virtual_loop loop;
  trace t;
  sluice::keyed_semaphore<char> per_key{1};
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(sluice::map_unordered(
                                  [&](job j) -> asio::awaitable<int> {
                                    auto p = co_await per_key.scoped_acquire(j.key);
                                    co_return co_await work(loop, t, j);
                                  },
                                  jobs("aaaabc", 100ms), 2),
                              [](int) {});
  });
  CHECK(loop.now() == 500ms);
  CHECK(started(t, 4) == 300ms);
}

TEST_CASE("inputs of a full key wait outside the slots up to the buffer, then the input waits",
          "[by_key]") {
  virtual_loop loop;
  trace t;
  recorded_input<job> in(jobs("aaaaaaaaab", 100ms));
  std::size_t most_ahead = 0;
  in.on_pull(
      [&](std::size_t) { most_ahead = std::max(most_ahead, in.pulled() + 1 - t.starts.size()); });
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(sluice::map_unordered([&](job j) { return work(loop, t, j); }, in, 4,
                                                    sluice::by_key(key_of, 2, {.buffer = 3})),
                              [](int) {});
  });
  // Pulled and not started: at most the buffer.
  CHECK(most_ahead == 3);
  CHECK(t.max_running['a'] == 2);
  // b is the 10th input: it is reached only as the a's start (backpressure).
  CHECK(started(t, 9) == 300ms);
  CHECK(loop.now() == 500ms);
  CHECK(t.finished == 10);
}

TEST_CASE("fail fast by key cancels the running tasks, drops the buffered ones and rethrows",
          "[by_key]") {
  virtual_loop loop;
  trace t;
  std::vector<job> in = jobs("aabbcc", 100ms);
  in[2].took = 13ms;  // b fails at 13 ms
  std::string what;
  loop.run([&]() -> asio::awaitable<void> {
    try {
      co_await sluice::for_each(sluice::map_unordered([&](job j) { return work(loop, t, j); }, in,
                                                      3, sluice::by_key(key_of, 1)),
                                [](int) {});
    } catch (const std::runtime_error& e) {
      what = e.what();
    }
  });
  CHECK(what == "job 2 failed");
  CHECK(loop.now() == 13ms);
  CHECK(t.now == 0);
  CHECK(t.cancelled == 2);  // the first a and c
  CHECK(t.starts.size() == 3);
}

TEST_CASE("return_exceptions by key runs every input and yields each outcome", "[by_key]") {
  virtual_loop loop;
  trace t;
  std::vector<job> in = jobs("aab", 100ms);
  in[0].took = 13ms;
  std::size_t ok = 0, failed = 0;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(
        sluice::map_unordered([&](job j) { return work(loop, t, j); }, in, 2,
                              sluice::by_key(key_of, 1), sluice::return_exceptions),
        [&](sluice::outcome<int> r) { ++(r ? ok : failed); });
  });
  CHECK(ok == 2);
  CHECK(failed == 1);
  CHECK(loop.now() == 113ms);
}

TEST_CASE("a key that frees while the async source's next() is pending is served at once",
          "[by_key]") {
  // The source takes 1 s per next(); the second a arrives at 2 s while the
  // first runs (until 2.5 s) and waits in the buffer while the third pull
  // runs (until 3 s): it starts when the first a ends, not when the pull
  // returns.
  virtual_loop loop;
  trace t;
  recorded_source<job> src(jobs("aab", 1500ms), 1s);
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(
        sluice::map_unordered([&](job j) { return work(loop, t, j); }, recorded_source<job>(src), 2,
                              sluice::by_key(key_of, 1)),
        [](int) {});
  });
  CHECK(started(t, 0) == 1s);
  CHECK(started(t, 1) == 2500ms);
  CHECK(started(t, 2) == 3s);
  CHECK(src.max_active() == 1);
}

TEST_CASE("by_key rejects per_key 0 and buffer 0 before anything starts", "[by_key]") {
  CHECK_THROWS_AS(sluice::by_key(key_of, 0), std::invalid_argument);
  CHECK_THROWS_AS(sluice::by_key(key_of, 1, {.buffer = 0}), std::invalid_argument);
}

TEST_CASE("a cancelled consumer cancels the keyed tasks and loses nothing", "[by_key]") {
  virtual_loop loop;
  trace t;
  bool aborted = false;
  loop.run([&]() -> asio::awaitable<void> {
    try {
      co_await sluice::with_timeout(
          150ms,
          sluice::for_each(sluice::map_unordered([&](job j) { return work(loop, t, j); },
                                                 jobs("aaab", 100ms), 2, sluice::by_key(key_of, 1)),
                           [](int) {}));
    } catch (const sluice::timeout_error&) {
      aborted = true;
    }
  });
  CHECK(aborted);
  CHECK(loop.now() == 150ms);
  CHECK(t.now == 0);
  CHECK(t.cancelled == 1);  // the second a
}

TEST_CASE("most_waiting gives a free slot to the key with the most inputs waiting", "[by_key]") {
  // a c d e b b b, limit 2, one per key. Oldest first, the b's start last and
  // run one after another: 500 ms. most_waiting pulls ahead and starts the
  // b's first, beside the others: 400 ms, the ideal (7 x 100 ms over 2
  // slots, rounded up to whole tasks).
  for (auto order : {sluice::key_order::oldest, sluice::key_order::most_waiting}) {
    virtual_loop loop;
    trace t;
    loop.run([&]() -> asio::awaitable<void> {
      co_await sluice::for_each(
          sluice::map_unordered([&](job j) { return work(loop, t, j); }, jobs("acdebbb", 100ms), 2,
                                sluice::by_key(key_of, 1, {.buffer = 8, .order = order})),
          [](int) {});
    });
    if (order == sluice::key_order::oldest) {
      CHECK(loop.now() == 500ms);
      CHECK(started(t, 4) == 200ms);
    } else {
      CHECK(loop.now() == 400ms);
      CHECK(started(t, 4) == 0ms);    // the first b: its key has 3 waiting
      CHECK(started(t, 0) == 0ms);    // a: the oldest among the keys with 1
      CHECK(started(t, 5) == 100ms);  // the b's one after another (per-key FIFO)
      CHECK(started(t, 2) == 200ms);  // at 200 ms b has one waiting as d and e: oldest first
      CHECK(started(t, 3) == 200ms);
      CHECK(started(t, 6) == 300ms);
    }
    CHECK(t.order['b'] == std::vector<int>{4, 5, 6});
    CHECK(t.max_running['b'] == 1);
  }
}

TEST_CASE("the per-host crawl by key reaches 90% of the ideal schedule", "[by_key]") {
  // examples/crawler.cpp's part two (examples/support/crawl_scenario.hpp):
  // 850 pages on 52 hosts, 8 at once, 2 per host, links found as pages are
  // fetched. The ideal (a schedule that knows the site) takes 21.19 s.
  namespace crawl = sluice_examples::crawl;
  const double ideal = crawl::ideal_makespan_s();
  CHECK(ideal == Approx(21.19).epsilon(0.001));
  const auto busiest = crawl::run(crawl::mode::most_waiting);
  const auto oldest = crawl::run(crawl::mode::oldest);
  const auto plain = crawl::run(crawl::mode::keyed_semaphore);
  for (const auto* r : {&busiest, &oldest, &plain}) {
    CHECK(r->pages == crawl::total_pages());
    CHECK(r->max_in_flight == crawl::limit);
    CHECK(r->max_per_host == crawl::per_host);
  }
  CHECK(busiest.max_waiting <= crawl::buffer);
  CHECK(oldest.max_waiting <= crawl::buffer);
  CHECK(busiest.makespan == nanoseconds(21'371'000'000));  // 99% of the ideal
  CHECK(oldest.makespan == nanoseconds(24'688'000'000));   // 86%: the largest host makes the tail
  CHECK(plain.makespan == nanoseconds(35'549'000'000));    // 60%: head-of-line blocking
  CHECK(busiest.makespan_s() <= ideal / 0.90);
  const auto group = crawl::run(crawl::mode::group);  // keyed_task_group, most_waiting
  CHECK(group.pages == crawl::total_pages());
  CHECK(group.max_in_flight == crawl::limit);
  CHECK(group.max_per_host == crawl::per_host);
  CHECK(group.makespan == nanoseconds(21'310'000'000));  // 99%: every discovered page is seen
  CHECK(group.max_waiting == 236);  // spawn never waits: every page found and not started
}

// ---- gather_with_concurrency by key ---------------------------------------

TEST_CASE("gather_with_concurrency by key gives a slot to the oldest task whose key has room",
          "[by_key]") {
  // The first case's input as tasks, made lazily from the jobs; the key is a
  // function of the task's index. Results in input order.
  virtual_loop loop;
  trace t;
  const std::vector<job> in = jobs("aaaabc", 100ms);
  std::vector<int> got;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<int>> tasks;
    for (auto& j : in) tasks.push_back(work(loop, t, j));
    got = co_await sluice::gather_with_concurrency(
        2, std::move(tasks), sluice::by_key([&](std::size_t i) { return in[i].key; }, 1));
  });
  CHECK(got == std::vector<int>{0, 1, 2, 3, 4, 5});
  CHECK(loop.now() == 400ms);
  CHECK(started(t, 4) == 0ms);
  CHECK(started(t, 5) == 100ms);
  CHECK(t.order['a'] == std::vector<int>{0, 1, 2, 3});
  CHECK(t.max == 2);
}

TEST_CASE("gather_with_concurrency by key fails fast, settles with return_exceptions", "[by_key]") {
  std::vector<job> in = jobs("aabbcc", 100ms);
  in[2].took = 13ms;  // b fails at 13 ms
  auto key = [&](std::size_t i) {
    return in[i].key;
  };
  SECTION("fail fast: the running tasks are cancelled and awaited, the error rethrown") {
    virtual_loop loop;
    trace t;
    std::string what;
    loop.run([&]() -> asio::awaitable<void> {
      std::vector<asio::awaitable<int>> tasks;
      for (auto& j : in) tasks.push_back(work(loop, t, j));
      try {
        co_await sluice::gather_with_concurrency(3, std::move(tasks), sluice::by_key(key, 1));
      } catch (const std::runtime_error& e) {
        what = e.what();
      }
    });
    CHECK(what == "job 2 failed");
    CHECK(loop.now() == 13ms);
    CHECK(t.now == 0);
    CHECK(t.cancelled == 2);
  }
  SECTION("return_exceptions: every task runs, outcomes in input order") {
    virtual_loop loop;
    trace t;
    std::vector<sluice::outcome<int>> got;
    loop.run([&]() -> asio::awaitable<void> {
      std::vector<asio::awaitable<int>> tasks;
      for (auto& j : in) tasks.push_back(work(loop, t, j));
      got = co_await sluice::gather_with_concurrency(3, std::move(tasks), sluice::by_key(key, 1),
                                                     sluice::return_exceptions);
    });
    REQUIRE(got.size() == 6);
    for (int i = 0; i < 6; ++i) CHECK(got[static_cast<std::size_t>(i)].has_value() == (i != 2));
    CHECK(got[5].value() == 5);
    CHECK(t.finished == 6);
    CHECK(loop.now() == 200ms);  // the second b starts at 13 ms, beside the first a and c
  }
}

TEST_CASE("gather_with_concurrency by key of void tasks, cancelled by its caller, loses nothing",
          "[by_key]") {
  virtual_loop loop;
  trace t;
  const std::vector<job> in = jobs("aaab", 100ms);
  bool timed_out = false;
  int done = 0;
  loop.run([&]() -> asio::awaitable<void> {
    // A lazy range (clang 14 cannot instantiate libstdc++ 12's std::views).
    sluice_test::lazy_tasks<asio::awaitable<void>> tasks(
        in.size(), [&](std::size_t i) -> asio::awaitable<void> {
          co_await work(loop, t, in[i]);
          ++done;
        });
    try {
      co_await sluice::with_timeout(
          150ms, sluice::gather_with_concurrency(
                     2, tasks, sluice::by_key([&](std::size_t i) { return in[i].key; }, 1)));
    } catch (const sluice::timeout_error&) {
      timed_out = true;
    }
  });
  CHECK(timed_out);
  CHECK(loop.now() == 150ms);
  CHECK(done == 2);  // the first a and b
  CHECK(t.now == 0);
  CHECK(t.cancelled == 1);  // the second a
  CHECK_THROWS_AS(sluice::gather_with_concurrency(0, std::vector<asio::awaitable<void>>{},
                                                  sluice::by_key([](std::size_t) { return 0; }, 1)),
                  std::invalid_argument);
}

// ---- keyed_task_group ------------------------------------------------------

namespace {

using char_group = sluice::keyed_task_group<char>;

// work() as a child of a task group (its result dropped).
asio::awaitable<void> child_work(virtual_loop& loop, trace& t, job j) {
  co_await work(loop, t, j);
}

}  // namespace

TEST_CASE("a keyed task group gives a slot to the oldest child whose key has room", "[by_key]") {
  virtual_loop loop;
  trace t;
  loop.run([&]() -> asio::awaitable<void> {
    co_await char_group::run(2, 1, [&](char_group& g) -> asio::awaitable<void> {
      for (auto& j : jobs("aaaabc", 100ms)) g.spawn(j.key, child_work(loop, t, j));
      CHECK(g.running() == 2);  // the first a and b
      CHECK(g.waiting() == 4);  // three a's and c wait outside the slots
      CHECK(g.keys() == 3);
      co_return;
    });
  });
  CHECK(loop.now() == 400ms);
  CHECK(started(t, 4) == 0ms);    // b: beside the first a
  CHECK(started(t, 5) == 100ms);  // c: the next free slot, not after the a's
  CHECK(t.order['a'] == std::vector<int>{0, 1, 2, 3});
  CHECK(t.max == 2);
  CHECK(t.max_running['a'] == 1);
}

TEST_CASE(
    "a keyed task group's spawn_when_ready waits while the buffer of waiting children is full",
    "[by_key]") {
  // Eight a's, one per key, limit 4, buffer 2: the producer is let in as the
  // a's start one after another; never more than 2 wait.
  virtual_loop loop;
  trace t;
  std::size_t most_waiting = 0;
  std::vector<nanoseconds> accepted;
  loop.run([&]() -> asio::awaitable<void> {
    co_await char_group::run(4, 1,
                             [&](char_group& g) -> asio::awaitable<void> {
                               for (auto& j : jobs("aaaaaaab", 100ms)) {
                                 const bool ok =
                                     co_await g.spawn_when_ready(j.key, child_work(loop, t, j));
                                 CHECK(ok);
                                 accepted.push_back(loop.now());
                                 most_waiting = std::max(most_waiting, g.waiting());
                               }
                             },
                             {.buffer = 2});
  });
  CHECK(most_waiting == 2);
  CHECK(accepted == std::vector<nanoseconds>{0ms, 0ms, 0ms, 100ms, 200ms, 300ms, 400ms, 500ms});
  CHECK(started(t, 7) == 500ms);  // b: reached only as the a's start (backpressure)
  CHECK(loop.now() == 700ms);
  CHECK(t.finished == 8);
}

TEST_CASE("a keyed task group fails fast: running children cancelled, waiting ones dropped",
          "[by_key]") {
  virtual_loop loop;
  trace t;
  std::vector<job> in = jobs("aabbcc", 100ms);
  in[2].took = 13ms;  // b fails at 13 ms
  std::string what;
  int producers_refused = 0;
  loop.run([&]() -> asio::awaitable<void> {
    try {
      co_await char_group::run(3, 1, [&](char_group& g) -> asio::awaitable<void> {
        for (auto& j : in) g.spawn(j.key, child_work(loop, t, j));
        co_await sluice::sleep(1s);  // cancelled by the failure
        ++producers_refused;
      });
    } catch (const std::runtime_error& e) {
      what = e.what();
    }
  });
  CHECK(what == "job 2 failed");
  CHECK(loop.now() == 13ms);
  CHECK(t.now == 0);
  CHECK(t.cancelled == 2);        // the first a and c
  CHECK(t.starts.size() == 3);    // the waiting a, b, c never started
  CHECK(producers_refused == 0);  // the body was cancelled too
}

TEST_CASE("a failing child of a keyed task group lets no waiting child of its key start",
          "[by_key]") {
  // a fails at 13 ms while the second a waits for its key and a slot is free:
  // the failure stops the group before the second a could take the room it
  // freed (found by tests/fuzz/by_key_fuzz.cpp).
  virtual_loop loop;
  trace t;
  std::vector<job> in = jobs("aa", 100ms);
  in[0].took = 13ms;
  bool failed = false;
  loop.run([&]() -> asio::awaitable<void> {
    try {
      co_await char_group::run(2, 1, [&](char_group& g) -> asio::awaitable<void> {
        for (auto& j : in) g.spawn(j.key, child_work(loop, t, j));
        co_return;
      });
    } catch (const std::runtime_error&) {
      failed = true;
    }
  });
  CHECK(failed);
  CHECK(t.starts.size() == 1);
  CHECK(t.cancelled == 0);
}

TEST_CASE("a keyed task group cancelled by its caller loses nothing, producers included",
          "[by_key]") {
  virtual_loop loop;
  trace t;
  bool timed_out = false;
  std::size_t spawned = 0;
  loop.run([&]() -> asio::awaitable<void> {
    try {
      co_await sluice::with_timeout(
          150ms, char_group::run(2, 1,
                                 [&](char_group& g) -> asio::awaitable<void> {
                                   for (auto& j : jobs("aaaaab", 100ms)) {
                                     co_await g.spawn_when_ready(j.key, child_work(loop, t, j));
                                     ++spawned;
                                   }
                                 },
                                 {.buffer = 1}));
    } catch (const sluice::timeout_error&) {
      timed_out = true;
    }
  });
  CHECK(timed_out);
  CHECK(loop.now() == 150ms);
  CHECK(t.now == 0);
  CHECK(t.cancelled == 1);  // the second a
  CHECK(spawned == 3);      // a, a (started at 100 ms), a (waiting); the fourth a's producer waited
  CHECK_THROWS_AS(char_group::run(0, 1, [](char_group&) -> asio::awaitable<void> { co_return; }),
                  std::invalid_argument);
  CHECK_THROWS_AS(char_group::run(1, 0, [](char_group&) -> asio::awaitable<void> { co_return; }),
                  std::invalid_argument);
}

// ---- property: seeded runs against a reference schedule ------------------

namespace {

// The schedule by_key promises, computed directly: at every instant, a free
// slot takes the oldest pulled input whose key has room; the input is pulled
// in order while fewer than `buffer` inputs wait for their key. most_waiting:
// the input is pulled as far as the buffer first, then a free slot takes the
// oldest input of the key with the most inputs waiting (and room), the key
// of the oldest input first among equals.
nanoseconds reference_makespan(const std::vector<job>& in, std::size_t limit, std::size_t per_key,
                               std::size_t buffer, bool most_waiting = false) {
  struct run {
    nanoseconds end;
    char key;
  };
  std::vector<run> running;
  std::vector<std::size_t> waiting;  // indices pulled, not started
  std::size_t pulled = 0;
  std::map<char, std::size_t> busy;
  nanoseconds now{0}, last{0};
  for (;;) {
    for (;;) {  // fill the slots at `now`
      if (running.size() >= limit) break;
      while (most_waiting && pulled < in.size() && waiting.size() < buffer)
        waiting.push_back(pulled++);
      std::map<char, std::size_t> queued;
      for (std::size_t i : waiting) ++queued[in[i].key];
      auto it = std::find_if(waiting.begin(), waiting.end(),
                             [&](std::size_t i) { return busy[in[i].key] < per_key; });
      if (most_waiting)
        for (auto j = it; j != waiting.end(); ++j)
          if (busy[in[*j].key] < per_key && queued[in[*j].key] > queued[in[*it].key]) it = j;
      if (it != waiting.end()) {
        ++busy[in[*it].key];
        running.push_back({now + in[*it].took, in[*it].key});
        last = std::max(last, now + in[*it].took);
        waiting.erase(it);
        continue;
      }
      if (pulled < in.size() && waiting.size() < buffer) {
        waiting.push_back(pulled++);
        continue;
      }
      break;
    }
    if (running.empty()) break;
    auto first = std::min_element(running.begin(), running.end(),
                                  [](const run& a, const run& b) { return a.end < b.end; });
    now = first->end;
    for (auto it = running.begin(); it != running.end();) {
      if (it->end == now) {
        --busy[it->key];
        it = running.erase(it);
      } else {
        ++it;
      }
    }
  }
  return last;
}

}  // namespace

namespace {

// A progress report: at (ms), started, done, failed, in flight, waiting.
using report_row = std::array<std::size_t, 6>;

auto record_rows(std::vector<report_row>& rows) {
  return sluice::progress(
      [&rows](const sluice::progress_info& p) {
        rows.push_back(
            {static_cast<std::size_t>(std::chrono::duration_cast<milliseconds>(p.elapsed).count()),
             p.started, p.done, p.failed, p.in_flight, p.waiting});
      },
      500ms);
}

}  // namespace

TEST_CASE("a keyed task group stopped from outside drops what waits and gives the running a grace",
          "[by_key]") {
  // 2 at once, 1 per key, aabc of 300 ms: a0 and b2 run, a1 waits for its
  // key, c3 for a slot. The stop at 100 ms (grace 150 ms) drops a1 and c3
  // unstarted, refuses spawn, cancels the body, and cancels a0 and b2 at
  // 250 ms; run returns normally. Progress counts the two cancelled as
  // failed, not the two unstarted.
  virtual_loop loop;
  trace t;
  sluice::stop_source stop;
  std::vector<report_row> rows;
  char_group* group = nullptr;
  bool body_cancelled = false, spawned_after = true;
  auto body = [&](char_group& g) -> asio::awaitable<void> {
    group = &g;
    for (const job& j : jobs("aabc", 300ms)) g.spawn(j.key, child_work(loop, t, j));
    try {
      co_await sluice::sleep(1h);
    } catch (const sluice::system_error&) {
      body_cancelled = true;
      throw;
    }
  };
  auto stopper = [&]() -> asio::awaitable<void> {
    co_await sluice::sleep(100ms);
    CHECK(group->waiting() == 2);
    stop.request(150ms);
    CHECK(group->waiting() == 0);
    CHECK(group->stopping());
    spawned_after = group->spawn('d', child_work(loop, t, {'d', 1ms, 9}));
  };
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::gather(char_group::run(2, 1, body, stop, record_rows(rows)), stopper());
  });
  CHECK(t.starts == std::vector<std::pair<int, nanoseconds>>{{0, 0ms}, {2, 0ms}});
  CHECK(t.cancelled == 2);
  CHECK(body_cancelled);
  CHECK_FALSE(spawned_after);
  CHECK(loop.now() == 250ms);
  CHECK(rows == std::vector<report_row>{{250, 2, 0, 2, 0, 0}});
}

TEST_CASE("a keyed task group on a keyed limit, stopped, withdraws its waits at once", "[by_key]") {
  // 2 at once, a keyed_semaphore of 1 per host that another caller holds
  // from 0 to 500 ms: a0 and a1 wait for a's permit, the group's asking slot
  // asks for it. The stop at 100 ms, with a grace of an hour, drops them and
  // withdraws the wait at once: run returns at 100 ms.
  virtual_loop loop;
  trace t;
  sluice::stop_source stop;
  sluice::keyed_semaphore<char> hosts{1};
  nanoseconds returned{-1};
  auto other = [&]() -> asio::awaitable<void> {
    auto p = co_await hosts.scoped_acquire('a');
    co_await sluice::sleep(500ms);
  };
  auto body = [&](char_group& g) -> asio::awaitable<void> {
    for (const job& j : jobs("aa", 300ms)) g.spawn(j.key, child_work(loop, t, j));
    co_return;
  };
  auto group = [&]() -> asio::awaitable<void> {
    co_await char_group::run(2, hosts, body, stop);
    returned = loop.now();
  };
  auto stopper = [&]() -> asio::awaitable<void> {
    co_await sluice::sleep(100ms);
    CHECK(hosts.waiters('a') == 1);
    stop.request(1h);
  };
  loop.run(
      [&]() -> asio::awaitable<void> { co_await sluice::gather(other(), group(), stopper()); });
  CHECK(t.starts.empty());
  CHECK(returned == 100ms);
  CHECK(loop.now() == 500ms);
  CHECK(hosts.keys() == 0);
}

TEST_CASE("a keyed task group stopped before run calls nothing and reports nothing", "[by_key]") {
  virtual_loop loop;
  sluice::stop_source stop;
  stop.request();
  sluice::keyed_semaphore<char> hosts{1};
  std::vector<report_row> rows;
  bool called = false;
  auto body = [&](char_group&) -> asio::awaitable<void> {
    called = true;
    co_return;
  };
  loop.run(char_group::run(2, 1, body, stop, record_rows(rows)));
  loop.run(char_group::run(2, hosts, body, stop, record_rows(rows)));
  CHECK_FALSE(called);
  CHECK(rows.empty());
  CHECK(loop.now() == 0ms);
}

TEST_CASE("progress of a keyed task group counts the children, with those waiting for their key",
          "[by_key]") {
  virtual_loop loop;
  trace t;
  std::vector<report_row> rows;
  SECTION("per_key 1, 2 at once, aaab: a1 and a2 wait for a's room") {
    loop.run(char_group::run(
        2, 1,
        [&](char_group& g) -> asio::awaitable<void> {
          for (const job& j : jobs("aaab", 1s)) g.spawn(j.key, child_work(loop, t, j));
          co_return;
        },
        record_rows(rows)));
    CHECK(rows == std::vector<report_row>{
                      {1000, 3, 1, 0, 2, 1}, {2000, 4, 3, 0, 1, 0}, {3000, 4, 4, 0, 0, 0}});
  }
  SECTION("a keyed_semaphore of 1, 2 at once, aab: the asking slot is no child") {
    sluice::keyed_semaphore<char> hosts{1};
    loop.run(char_group::run(
        2, hosts,
        [&](char_group& g) -> asio::awaitable<void> {
          for (const job& j : jobs("aab", 1s)) g.spawn(j.key, child_work(loop, t, j));
          co_return;
        },
        record_rows(rows)));
    CHECK(rows == std::vector<report_row>{{1000, 3, 1, 0, 2, 0}, {2000, 3, 3, 0, 0, 0}});
  }
}

TEST_CASE("seeded runs keep the caps, per-key FIFO and the reference schedule's makespan",
          "[by_key]") {
  for (unsigned seed = 1; seed <= 200; ++seed) {
    std::mt19937 rng(seed);
    const std::size_t limit = 1 + rng() % 6, per_key = 1 + rng() % 3, buffer = 1 + rng() % 8;
    const std::size_t n = rng() % 40, keys = 1 + rng() % 5;
    std::vector<job> in;
    for (std::size_t i = 0; i < n; ++i) {
      // Durations in odd microseconds with a distinct tail per input, so no
      // two ends meet by accident (ties make the order of equal instants
      // visible, which the reference does not model).
      in.push_back({static_cast<char>('a' + rng() % keys),
                    std::chrono::microseconds(1000 * (1 + rng() % 50) + 2 * i + 1),
                    static_cast<int>(i)});
    }
    for (auto order : {sluice::key_order::oldest, sluice::key_order::most_waiting}) {
      virtual_loop loop;
      trace t;
      std::size_t got = 0;
      loop.run([&]() -> asio::awaitable<void> {
        co_await sluice::for_each(
            sluice::map_unordered(
                [&](job j) { return work(loop, t, j); }, in, limit,
                sluice::by_key(key_of, per_key, {.buffer = buffer, .order = order})),
            [&](int) { ++got; });
      });
      const bool most_waiting = order == sluice::key_order::most_waiting;
      INFO("seed " << seed << " limit " << limit << " per_key " << per_key << " buffer " << buffer
                   << " most_waiting " << most_waiting);
      CHECK(got == n);
      CHECK(t.max <= limit);
      for (auto& [k, m] : t.max_running) CHECK(m <= per_key);
      for (auto& [k, ids] : t.order) CHECK(std::is_sorted(ids.begin(), ids.end()));
      CHECK(loop.now() == reference_makespan(in, limit, per_key, buffer, most_waiting));
    }
    {  // keyed_task_group, every child spawned at 0: the same schedule
      virtual_loop loop;
      trace t;
      loop.run([&]() -> asio::awaitable<void> {
        co_await char_group::run(limit, per_key, [&](char_group& g) -> asio::awaitable<void> {
          for (auto& j : in) g.spawn(j.key, child_work(loop, t, j));
          co_return;
        });
      });
      INFO("seed " << seed << " keyed_task_group");
      CHECK(t.finished == n);
      CHECK(t.max <= limit);
      for (auto& [k, m] : t.max_running) CHECK(m <= per_key);
      for (auto& [k, ids] : t.order) CHECK(std::is_sorted(ids.begin(), ids.end()));
      CHECK(loop.now() == reference_makespan(in, limit, per_key, n + 1));
    }
    // gather_with_concurrency by key: the same schedule, results in input order.
    virtual_loop loop;
    trace t;
    std::vector<int> got;
    loop.run([&]() -> asio::awaitable<void> {
      sluice_test::lazy_tasks<asio::awaitable<int>> tasks(
          in.size(), [&](std::size_t i) { return work(loop, t, in[i]); });
      got = co_await sluice::gather_with_concurrency(
          limit, tasks,
          sluice::by_key([&](std::size_t i) { return in[i].key; }, per_key, {.buffer = buffer}));
    });
    INFO("seed " << seed << " gather");
    CHECK(got.size() == n);
    CHECK(std::is_sorted(got.begin(), got.end()));
    CHECK(t.max <= limit);
    CHECK(loop.now() == reference_makespan(in, limit, per_key, buffer));
  }
}

namespace {

// An async source whose next() never suspends.
struct ready_source {
  std::vector<job> items;
  std::size_t at = 0;
  asio::awaitable<std::optional<job>> next() {
    if (at == items.size()) co_return std::nullopt;
    co_return items[at++];
  }
};

}  // namespace

TEST_CASE("an async source whose next() completes without suspending is pulled to its end",
          "[by_key]") {
  // The pull may finish inside the call that starts it: no wake-up is lost.
  virtual_loop loop;
  trace t;
  loop.run([&]() -> asio::awaitable<void> {
    // (Made here, not inside the co_await: g++ 12 may destroy such
    // temporaries twice.)
    ready_source src{jobs("aabc", 100ms)};
    co_await sluice::for_each(sluice::map_unordered([&](job j) { return work(loop, t, j); },
                                                    std::move(src), 2, sluice::by_key(key_of, 1)),
                              [](int) {});
  });
  CHECK(t.finished == 4);
  CHECK(loop.now() == 200ms);
  CHECK(started(t, 2) == 0ms);    // b: beside the first a
  CHECK(started(t, 3) == 100ms);  // c: beside the second a
}

// ---- by_key with the caller's keyed_semaphore / keyed_rate_limiter --------

namespace {

// The tasks of a fan-out by a shared keyed_semaphore of one permit per host,
// and another caller of the same semaphore: `unheld` counts tasks that
// started without their host's permit in hand (a slot held by a task that
// would wait for its host).
struct shared_hosts {
  shared_hosts(virtual_loop& l, trace& tr) : loop(l), t(tr) {}
  virtual_loop& loop;
  trace& t;
  sluice::keyed_semaphore<char> hosts{1};
  std::size_t unheld = 0;
  std::map<char, bool> other_holds;
  std::vector<nanoseconds> other_got;

  asio::awaitable<int> task(job j) {
    if (hosts.value(j.key) != 0 || t.running[j.key] != 0 || other_holds[j.key]) ++unheld;
    co_return co_await work(loop, t, j);
  }
  // Another part of the service: asks for `key` after `after`, holds it for
  // `hold`.
  asio::awaitable<void> other(char key, nanoseconds after, nanoseconds hold) {
    if (after != 0ms) co_await sluice::sleep(after);
    auto p = co_await hosts.scoped_acquire(key);
    other_got.push_back(loop.now());
    other_holds[key] = true;
    co_await sluice::sleep(hold);
    other_holds[key] = false;
  }
  // The jobs of `keys` as children of a keyed task group limited by `hosts`.
  asio::awaitable<void> group(std::string keys, std::size_t limit) {
    co_await char_group::run(limit, hosts,
                             [self = this, &keys](char_group& g) -> asio::awaitable<void> {
                               for (auto& j : jobs(keys, 100ms)) g.spawn(j.key, self->child(j));
                               co_return;
                             });
  }
  asio::awaitable<void> child(job j) { co_await task(j); }
  // The same through map_unordered by `hosts`.
  asio::awaitable<void> map(std::string keys, std::size_t limit) {
    co_await sluice::for_each(
        sluice::map_unordered([self = this](job j) { return self->task(j); }, jobs(keys, 100ms),
                              limit, sluice::by_key(key_of, hosts)),
        [](int) {});
  }
};

}  // namespace

TEST_CASE(
    "by_key with a shared keyed_semaphore gives a slot only to an input whose permit is in hand",
    "[by_key]") {
  // aaabbcd, 2 at once, a keyed_semaphore of 1 per host that another caller
  // also uses: it holds a from 0 to 250 ms, asks again at 260 ms and holds it
  // 50 ms. b, c, d run while a is held elsewhere, then nothing can start
  // until 250 ms (both slots free, nobody holds one for a); a's permits go
  // in FIFO order: ours at 250 (asked at 200), ours at 350 (asked at 250),
  // the other caller's at 450 (asked at 260), ours at 500.
  virtual_loop loop;
  trace t;
  shared_hosts s{loop, t};
  SECTION("map_unordered") {
    auto crawl = [&]() -> asio::awaitable<void> {
      co_await sluice::for_each(
          sluice::map_unordered([&](job j) { return s.task(j); }, jobs("aaabbcd", 100ms), 2,
                                sluice::by_key(key_of, s.hosts)),
          [](int) {});
    };
    loop.run([&]() -> asio::awaitable<void> {
      co_await sluice::gather(s.other('a', 0ms, 250ms), s.other('a', 260ms, 50ms), crawl());
    });
  }
  SECTION("keyed_task_group: the same schedule, children spawned at 0") {
    loop.run([&]() -> asio::awaitable<void> {
      co_await sluice::gather(s.other('a', 0ms, 250ms), s.other('a', 260ms, 50ms),
                              s.group("aaabbcd", 2));
    });
  }
  CHECK(s.unheld == 0);
  CHECK(started(t, 3) == 0ms);  // b
  CHECK(started(t, 5) == 0ms);  // c
  CHECK(started(t, 4) == 100ms);
  CHECK(started(t, 6) == 100ms);
  CHECK(started(t, 0) == 250ms);
  CHECK(started(t, 1) == 350ms);
  CHECK(started(t, 2) == 500ms);
  CHECK(s.other_got == std::vector<nanoseconds>{0ms, 450ms});
  CHECK(loop.now() == 600ms);
  CHECK(t.max == 2);
  CHECK(s.hosts.keys() == 0);
}

namespace {

// Starts per key that fall in one window of `per` at most, over a trace.
std::size_t most_starts_per_window(const trace& t, const std::vector<job>& in, nanoseconds per) {
  std::size_t most = 0;
  for (auto& [id, at] : t.starts) {
    std::size_t n = 0;
    for (auto& [id2, at2] : t.starts)
      if (in[id2].key == in[id].key && at2 >= at && at2 < at + per) ++n;
    most = std::max(most, n);
  }
  return most;
}

}  // namespace

TEST_CASE("by_key with a keyed_rate_limiter takes each host's start when its task starts",
          "[by_key]") {
  // aaaaabb, 3 at once, 2 starts per host per second: two a's and b at 0,
  // the second b at 100 ms (a's window is full: no slot waits for it), the
  // next two a's when the window opens at 1 s, the last at 2 s.
  const std::vector<job> in = jobs("aaaaabb", 100ms);
  const std::vector<std::pair<int, nanoseconds>> expected{{0, 0ms}, {1, 0ms}, {5, 0ms}, {6, 100ms},
                                                          {2, 1s},  {3, 1s},  {4, 2s}};
  SECTION("map_unordered") {
    virtual_loop loop;
    trace t;
    sluice::keyed_rate_limiter<char> per_host{loop.get_executor(), 2, 1s};
    loop.run([&]() -> asio::awaitable<void> {
      co_await sluice::for_each(sluice::map_unordered([&](job j) { return work(loop, t, j); }, in,
                                                      3, sluice::by_key(key_of, per_host)),
                                [](int) {});
    });
    CHECK(t.starts == expected);
    CHECK(most_starts_per_window(t, in, 1s) == 2);
    CHECK(per_host.stats().acquired == 7);  // one start per task, none spent otherwise
    CHECK(loop.now() == 2100ms);
  }
  SECTION("gather_with_concurrency: results in input order") {
    virtual_loop loop;
    trace t;
    sluice::keyed_rate_limiter<char> per_host{loop.get_executor(), 2, 1s};
    std::vector<int> got;
    loop.run([&]() -> asio::awaitable<void> {
      sluice_test::lazy_tasks<asio::awaitable<int>> tasks(
          in.size(), [&](std::size_t i) { return work(loop, t, in[i]); });
      got = co_await sluice::gather_with_concurrency(
          3, tasks, sluice::by_key([&](std::size_t i) { return in[i].key; }, per_host));
    });
    CHECK(got == std::vector<int>{0, 1, 2, 3, 4, 5, 6});
    CHECK(t.starts == expected);
    CHECK(per_host.stats().acquired == 7);
  }
}

TEST_CASE("by_key gives back a grant that came while the slot went to another key", "[by_key]") {
  // abab, 2 at once, 1 start per host per second: a and b at 0; at 1 s both
  // waits are granted at the same instant, a (older) takes the slot and b's
  // start is given back, so the second slot takes b at 1 s, not at 2 s.
  const std::vector<job> in = jobs("abab", 100ms);
  virtual_loop loop;
  trace t;
  sluice::keyed_rate_limiter<char> per_host{loop.get_executor(), 1, 1s};
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(sluice::map_unordered([&](job j) { return work(loop, t, j); }, in, 2,
                                                    sluice::by_key(key_of, per_host)),
                              [](int) {});
  });
  CHECK(t.starts == std::vector<std::pair<int, nanoseconds>>{{0, 0ms}, {1, 0ms}, {2, 1s}, {3, 1s}});
  CHECK(per_host.stats().acquired == 4);
  CHECK(loop.now() == 1100ms);
}

TEST_CASE(
    "a keyed_rate_limiter built without an executor serves by_key on the loop's virtual clock",
    "[by_key]") {
  // by_key binds it to the fan-out's clock before its first try_acquire, as
  // a waiter would (before: bound to the steady clock there, logic_error at
  // the first wait; the fan-out hung). aaaaabb, 3 at once, 2 starts per host
  // per second: the schedule of the limiter built with the loop's executor.
  const std::vector<job> in = jobs("aaaaabb", 100ms);
  virtual_loop loop;
  trace t;
  sluice::keyed_rate_limiter<char> per_host{2, 1s};
  SECTION("map_unordered") {
    loop.run([&]() -> asio::awaitable<void> {
      co_await sluice::for_each(sluice::map_unordered([&](job j) { return work(loop, t, j); }, in,
                                                      3, sluice::by_key(key_of, per_host)),
                                [](int) {});
    });
  }
  SECTION("keyed_task_group: b's first child in the asking slot at 0") {
    loop.run([&]() -> asio::awaitable<void> {
      co_await char_group::run(3, per_host, [&](char_group& g) -> asio::awaitable<void> {
        for (const job& j : in) g.spawn(j.key, child_work(loop, t, j));
        co_return;
      });
    });
  }
  std::ranges::sort(t.starts, {}, [](auto& s) { return std::pair(s.second, s.first); });
  CHECK(t.starts == std::vector<std::pair<int, nanoseconds>>{
                        {0, 0ms}, {1, 0ms}, {5, 0ms}, {6, 100ms}, {2, 1s}, {3, 1s}, {4, 2s}});
  CHECK(per_host.stats().acquired == 7);
  CHECK(loop.now() == 2100ms);
}

TEST_CASE("a child spawned while the group's asking slot is its last free one starts in it at once",
          "[by_key]") {
  // 2 at once, a keyed_semaphore of 1 per host: a0 runs, a1 waits for a's
  // permit and the group keeps the second slot to ask for it; b2, spawned
  // then, is free: it starts in that slot at 0 (before: at 100 ms, when a0
  // ended, the asking slot not told of it).
  virtual_loop loop;
  trace t;
  sluice::keyed_semaphore<char> hosts{1};
  loop.run([&]() -> asio::awaitable<void> {
    co_await char_group::run(2, hosts, [&](char_group& g) -> asio::awaitable<void> {
      for (const job& j : jobs("aab", 100ms)) g.spawn(j.key, child_work(loop, t, j));
      co_return;
    });
  });
  CHECK(t.starts == std::vector<std::pair<int, nanoseconds>>{{0, 0ms}, {2, 0ms}, {1, 100ms}});
  CHECK(loop.now() == 200ms);
  CHECK(hosts.keys() == 0);
}

namespace {

// A keyed limit whose wait answers without suspending, as a
// keyed_rate_limiter's on the steady clock does when a key's window opens
// between the fan-out's try_acquire and its wait: try_take refuses, wait
// grants at once.
struct answers_at_once {
  std::size_t waits = 0;
};

}  // namespace

template <>
struct sluice::detail::keyed_limit_traits<answers_at_once> {
  static constexpr bool valid = true;
  using limit = answers_at_once;
  using key_type = char;
  struct grant {};
  static void bind(limit&, const asio::any_io_executor&) noexcept {}
  static std::optional<grant> try_take(limit&, char) { return std::nullopt; }
  static asio::awaitable<grant> wait(limit& l, char) {
    ++l.waits;
    co_return grant{};
  }
};

TEST_CASE("a keyed limit's wait that ends before the fan-out parks is not lost", "[by_key]") {
  // ab, 1 at once: each key's wait is granted inside the call that starts
  // it; the fan-out takes that grant instead of parking (before: it parked
  // after the wake-up and never woke, a deadlock at 0).
  virtual_loop loop;
  trace t;
  answers_at_once limit;
  SECTION("map_unordered") {
    loop.run([&]() -> asio::awaitable<void> {
      co_await sluice::for_each(
          sluice::map_unordered([&](job j) { return work(loop, t, j); }, jobs("ab", 100ms), 1,
                                sluice::by_key(key_of, limit)),
          [](int) {});
    });
  }
  SECTION("keyed_task_group") {
    loop.run([&]() -> asio::awaitable<void> {
      co_await char_group::run(1, limit, [&](char_group& g) -> asio::awaitable<void> {
        for (const job& j : jobs("ab", 100ms)) g.spawn(j.key, child_work(loop, t, j));
        co_return;
      });
    });
  }
  CHECK(t.starts == std::vector<std::pair<int, nanoseconds>>{{0, 0ms}, {1, 100ms}});
  CHECK(loop.now() == 200ms);
}

namespace {

// Spawns `fan_out` and cancels it at `at` plus `turns` loop turns, then runs
// the loop until everything is over; returns its task.
template <class F>
sluice_test::task& cancelled_at(sluice_test::tasks_on_loop& h, nanoseconds at, int turns,
                                F fan_out) {
  auto& fan = h.spawn(std::move(fan_out));
  h.spawn([&fan, at, turns]() -> asio::awaitable<void> {
    co_await sluice::sleep(at);
    for (int i = 0; i < turns; ++i) co_await asio::post(asio::use_awaitable);
    fan.cancel();
  });
  h.loop.run_for(10s);
  return fan;
}

}  // namespace

TEST_CASE("a fan-out by a keyed limit cancelled at any point leaves no permit, start or waiter",
          "[by_key]") {
  // Cancelled at every instant the schedule changes, after 0 to 5 more loop
  // turns: while waiting for a host's permit, with permits in hand, between.
  for (nanoseconds at : {0ms, 50ms, 100ms, 200ms, 250ms, 300ms, 350ms, 450ms, 500ms})
    for (int turns = 0; turns <= 5; ++turns) {
      INFO("cancelled at " << at.count() << " ns after " << turns << " turns");
      for (bool group : {false, true}) {  // keyed_semaphore shared with another caller
        INFO((group ? "keyed_task_group" : "map_unordered"));
        trace t;
        sluice_test::tasks_on_loop h;
        shared_hosts s{h.loop, t};
        h.spawn([&] { return s.other('a', 0ms, 250ms); });
        nanoseconds ended{-1};
        std::size_t left_waiting = 1;
        auto& fan = cancelled_at(h, at, turns, [&]() -> asio::awaitable<void> {
          try {
            // (Named: g++ 12 may destroy a co_await operand's temporaries twice.)
            auto run = group ? s.group("aaabbcd", 2) : s.map("aaabbcd", 2);
            co_await std::move(run);
          } catch (...) {
            ended = h.loop.now();
            left_waiting = s.hosts.stats().waiting;
            throw;
          }
        });
        // At once, and no wait of ours on the limit outlives the call.
        CHECK(ended == at);
        CHECK(left_waiting == 0);
        CHECK(fan.done);
        CHECK(s.unheld == 0);
        CHECK(t.now == 0);
        CHECK(s.hosts.keys() == 0);  // no key held or waited for
        CHECK(s.hosts.stats().in_use == 0);
      }
      {  // keyed_rate_limiter: a start only for each task that ran
        trace t;
        sluice_test::tasks_on_loop h;
        sluice::keyed_rate_limiter<char> per_host{h.loop.get_executor(), 1, 200ms};
        auto& fan = cancelled_at(h, at, turns, [&]() -> asio::awaitable<void> {
          co_await sluice::for_each(
              sluice::map_unordered([&](job j) { return work(h.loop, t, j); }, jobs("ababab", 50ms),
                                    2, sluice::by_key(key_of, per_host)),
              [](int) {});
        });
        CHECK(fan.done);
        CHECK(t.now == 0);
        CHECK(per_host.stats().acquired == t.starts.size());
        CHECK(per_host.waiters('a') + per_host.waiters('b') == 0);
      }
    }
}

TEST_CASE("by_key with a keyed limit rejects buffer 0 and limit 0 before anything starts",
          "[by_key]") {
  sluice::keyed_semaphore<char> hosts{1};
  const std::vector<job> in = jobs("ab", 100ms);
  auto fn = [](job) -> asio::awaitable<int> {
    co_return 0;
  };
  CHECK_THROWS_AS(sluice::by_key(key_of, hosts, {.buffer = 0}), std::invalid_argument);
  CHECK_THROWS_AS(sluice::map_unordered(fn, in, 0, sluice::by_key(key_of, hosts)),
                  std::invalid_argument);
  CHECK_THROWS_AS(
      char_group::run(0, hosts, [](char_group&) -> asio::awaitable<void> { co_return; }),
      std::invalid_argument);
  CHECK(hosts.keys() == 0);
}

TEST_CASE("a fan-out by a keyed limit whose caller was cancelled before it called takes nothing",
          "[by_key]") {
  trace t;
  sluice_test::tasks_on_loop h;
  shared_hosts s{h.loop, t};
  auto& fan = h.spawn([&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      co_await sluice::sleep(1h);  // cancelled here...
    } catch (const sluice::system_error&) {
    }
    co_await sluice::for_each(  // ...then calls
        sluice::map_unordered([&](job j) { return s.task(j); }, jobs("aab", 100ms), 2,
                              sluice::by_key(key_of, s.hosts)),
        [](int) {});
  });
  h.poll();
  fan.cancel();
  h.loop.run_for(1s);
  CHECK(fan.cancelled());
  CHECK(t.starts.empty());
  CHECK(s.hosts.keys() == 0);
  CHECK(s.hosts.stats().acquired == 0);
}

TEST_CASE("a keyed task group whose caller was cancelled before it called binds no clock",
          "[by_key]") {
  // A keyed_rate_limiter bound to the steady clock, a caller on a virtual
  // loop cancelled before it calls: operation_aborted, the body never
  // called; not the limiter's logic_error for the other clock (before: the
  // group bound the limiter first).
  asio::io_context io;
  sluice::keyed_rate_limiter<char> per_host{io.get_executor(), 1, 1s};
  sluice_test::tasks_on_loop h;
  bool called = false;
  auto& group = h.spawn([&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      co_await sluice::sleep(1h);  // cancelled here...
    } catch (const sluice::system_error&) {
    }
    co_await char_group::run(2, per_host, [&](char_group&) -> asio::awaitable<void> {  // ...then
      called = true;
      co_return;
    });
  });
  h.poll();
  group.cancel();
  h.loop.run_for(1s);
  CHECK(group.cancelled());
  CHECK_FALSE(called);
}

TEST_CASE("fail fast by a keyed limit releases the permits and withdraws the waits", "[by_key]") {
  // aabbcc, 4 at once, 1 per host: a, b, c start at 0 and the fourth slot
  // waits on a, b and c's permits; b fails at 13 ms.
  virtual_loop loop;
  trace t;
  shared_hosts s{loop, t};
  std::vector<job> in = jobs("aabbcc", 100ms);
  in[2].took = 13ms;
  CHECK_THROWS_WITH(loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(sluice::map_unordered([&](job j) { return s.task(j); }, in, 4,
                                                    sluice::by_key(key_of, s.hosts)),
                              [](int) {});
  }),
                    "job 2 failed");
  CHECK(loop.now() == 13ms);
  CHECK(t.cancelled == 2);
  CHECK(s.hosts.keys() == 0);
  CHECK(s.hosts.stats().in_use == 0);
}

// --- review ---

TEST_CASE("a keyed_rate_limiter start by_key took without a wait is given back exactly if unused",
          "[by_key][review]") {
  // The grant by_key takes for a free key (try_take) is given back if its
  // task never starts (the fan-out cancelled or failing fast between the
  // hand-out and the start): the limiter must forget that very start. On the
  // steady clock the grant's key must be the instant the window recorded, or
  // the start stays in the window (the key full for `per`, though no task ran)
  // while stats() uncounts it.
  asio::io_context io;
  sluice::keyed_rate_limiter<int> per_key{io.get_executor(), 1, 1h};
  using traits = sluice::detail::keyed_limit_traits<sluice::keyed_rate_limiter<int>>;
  std::size_t taken = 0, free_again = 0;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        for (int k = 0; k < 50; ++k) {
          if (traits::try_take(per_key, k)) ++taken;  // dropped at once, unstarted
          if (per_key.try_acquire(k)) ++free_again;
        }
        co_return;
      },
      asio::detached);
  io.run();
  CHECK(taken == 50);
  CHECK(free_again == 50);
  CHECK(per_key.stats().acquired == 50);  // the 50 try_acquire starts, no more
}

TEST_CASE("by_key with a shed keyed_semaphore fails with its overloaded_error, leaving nothing",
          "[by_key][review]") {
  // Another caller holds a from 0 to 250 ms; the semaphore sheds every wait
  // (max_waiting 0). "ab", 2 at once: b starts at 0 (free), a's wait is
  // refused at once. map_unordered fails fast: at 0 with overloaded_error, b
  // cancelled. return_exceptions: the refusal ends the stream as an input's
  // error does, b finishing first. keyed_task_group: its asker meets the
  // refusal before it starts b, and fails the group at 0.
  for (int form = 0; form < 3; ++form) {
    INFO("form " << form << " (0 map_unordered, 1 return_exceptions, 2 keyed_task_group)");
    virtual_loop loop;
    trace t;
    sluice::keyed_semaphore<char> hosts{loop.get_executor(), 1,
                                        sluice::shed_options{.max_waiting = 0}};
    nanoseconds failed_at{-1};
    std::size_t left_waiting = 9, left_in_use = 9, outcomes = 0;
    auto other = [&]() -> asio::awaitable<void> {
      auto p = co_await hosts.scoped_acquire('a');
      co_await sluice::sleep(250ms);
    };
    auto fan = [&]() -> asio::awaitable<void> {
      try {
        if (form == 0) {
          co_await sluice::for_each(
              sluice::map_unordered([&](job j) { return work(loop, t, j); }, jobs("ab", 100ms), 2,
                                    sluice::by_key(key_of, hosts)),
              [](int) {});
        } else if (form == 1) {
          co_await sluice::for_each(
              sluice::map_unordered([&](job j) { return work(loop, t, j); }, jobs("ab", 100ms), 2,
                                    sluice::by_key(key_of, hosts), sluice::return_exceptions),
              [&](sluice::outcome<int>) { ++outcomes; });
        } else {
          co_await char_group::run(2, hosts, [&](char_group& g) -> asio::awaitable<void> {
            for (auto& j : jobs("ab", 100ms)) g.spawn(j.key, child_work(loop, t, j));
            co_return;
          });
        }
      } catch (const sluice::overloaded_error&) {
        failed_at = loop.now();
        left_waiting = hosts.stats().waiting;
        left_in_use = hosts.stats().in_use;
      }
    };
    loop.run([&]() -> asio::awaitable<void> { co_await sluice::gather(other(), fan()); });
    CHECK(failed_at == (form == 1 ? 100ms : 0ms));
    CHECK(left_waiting == 0);
    CHECK(left_in_use == 1);  // the other caller's
    if (form == 2) {          // the asker met the refusal before b: b dropped unstarted
      CHECK(t.starts.empty());
    } else {
      CHECK(t.starts == std::vector<std::pair<int, nanoseconds>>{{1, 0ms}});
    }
    CHECK(t.cancelled == (form == 0 ? 1u : 0u));
    CHECK(outcomes == (form == 1 ? 1u : 0u));
    CHECK(t.now == 0);
    CHECK(hosts.keys() == 0);
  }
}

namespace {

// Runs `call` in a task that asked throw_if_cancelled(false) and whose
// cancellation was requested before it called; returns the task.
template <class F>
sluice_test::task& called_after_cancel(sluice_test::tasks_on_loop& h, F call) {
  auto& fan = h.spawn([call]() mutable -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      co_await sluice::sleep(1h);  // cancelled here, then calls
    } catch (const sluice::system_error&) {
    }
    co_await call();
  });
  h.poll();
  fan.cancel();
  h.loop.run_for(1s);
  return fan;
}

}  // namespace

TEST_CASE(
    "a keyed task group by a keyed limit whose caller was cancelled before it called "
    "takes nothing",
    "[by_key][review]") {
  for (bool limited : {false, true}) {  // a number per key as the reference
    INFO((limited ? "keyed_semaphore" : "per_key 1"));
    trace t;
    sluice_test::tasks_on_loop h;
    shared_hosts s{h.loop, t};
    auto& fan = called_after_cancel(h, [&]() -> asio::awaitable<void> {
      if (limited) {
        co_await s.group("aab", 2);
      } else {
        co_await char_group::run(2, 1, [&](char_group& g) -> asio::awaitable<void> {
          for (auto& j : jobs("aab", 100ms)) g.spawn(j.key, child_work(h.loop, t, j));
          co_return;
        });
      }
    });
    CHECK(fan.cancelled());
    CHECK(t.starts.empty());
    CHECK(s.hosts.keys() == 0);
    CHECK(s.hosts.stats().acquired == 0);
  }
}

TEST_CASE("by_key with a keyed_semaphore of 2 keeps the buffer bound and per_key 2's schedule",
          "[by_key][review]") {
  // The case "inputs of a full key wait outside the slots up to the buffer"
  // with the user's keyed_semaphore of 2 per key for per_key 2.
  virtual_loop loop;
  trace t;
  sluice::keyed_semaphore<char> per_host{2};
  recorded_input<job> in(jobs("aaaaaaaaab", 100ms));
  std::size_t most_ahead = 0;
  in.on_pull(
      [&](std::size_t) { most_ahead = std::max(most_ahead, in.pulled() + 1 - t.starts.size()); });
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(
        sluice::map_unordered([&](job j) { return work(loop, t, j); }, in, 4,
                              sluice::by_key(key_of, per_host, {.buffer = 3})),
        [](int) {});
  });
  CHECK(most_ahead == 3);
  CHECK(t.max_running['a'] == 2);
  CHECK(started(t, 9) == 300ms);
  CHECK(loop.now() == 500ms);
  CHECK(t.finished == 10);
  CHECK(per_host.keys() == 0);
}

TEST_CASE("an error of the key function or the input with waits on the keyed limit withdraws them",
          "[by_key][review]") {
  // An async input yields a0, a1, then fails (or the key function throws)
  // at 30 ms; another caller holds a from 0 to 250 ms, so the fan-out waits
  // on a's permit when the error comes: it fails at once, nothing started,
  // its wait withdrawn before it returns.
  for (bool key_throws : {false, true}) {
    INFO((key_throws ? "the key function throws" : "the input throws"));
    virtual_loop loop;
    trace t;
    shared_hosts s{loop, t};
    sluice_test::recorded_source<job> in(jobs("aab", 100ms), 10ms);
    if (!key_throws) in.throw_at(2);
    auto key = [key_throws](const job& j) {
      if (key_throws && j.id == 2) throw std::runtime_error("no key");
      return j.key;
    };
    nanoseconds failed_at{-1};
    std::size_t left_waiting = 9;
    auto fan = [&]() -> asio::awaitable<void> {
      try {
        co_await sluice::for_each(sluice::map_unordered([&](job j) { return s.task(j); }, in, 2,
                                                        sluice::by_key(key, s.hosts)),
                                  [](int) {});
      } catch (const std::runtime_error&) {
        failed_at = loop.now();
        left_waiting = s.hosts.stats().waiting;
      }
    };
    loop.run([&]() -> asio::awaitable<void> {
      co_await sluice::gather(s.other('a', 0ms, 250ms), fan());
    });
    CHECK(failed_at == 30ms);
    CHECK(left_waiting == 0);
    CHECK(t.starts.empty());
    CHECK(s.hosts.keys() == 0);
    CHECK(s.hosts.stats().acquired == 1);  // the other caller's
  }
}

TEST_CASE("a keyed limit destroyed as soon as a cancelled fan-out by it returns is not used again",
          "[by_key][review]") {
  // Cancelled while tasks run and waits are queued on the limits (a's
  // permit, a's next start) or at their grant instant, after 0 to 3 turns;
  // the limits die the moment the call returns (ASan sees any later use).
  for (nanoseconds at : {0ms, 50ms, 100ms})
    for (int turns = 0; turns <= 3; ++turns) {
      INFO("cancelled at " << at.count() << " ns after " << turns << " turns");
      trace t;
      sluice_test::tasks_on_loop h;
      auto& fan = cancelled_at(h, at, turns, [&]() -> asio::awaitable<void> {
        auto hosts = std::make_unique<sluice::keyed_semaphore<char>>(h.loop.get_executor(), 1);
        auto rate =
            std::make_unique<sluice::keyed_rate_limiter<char>>(h.loop.get_executor(), 1, 100ms);
        auto map = [&](auto& limit) -> asio::awaitable<void> {
          co_await sluice::for_each(
              sluice::map_unordered([&](job j) { return work(h.loop, t, j); }, jobs("aab", 100ms),
                                    2, sluice::by_key(key_of, limit)),
              [](int) {});
        };
        auto group = [&](auto& limit) -> asio::awaitable<void> {
          co_await char_group::run(2, limit, [&](char_group& g) -> asio::awaitable<void> {
            for (auto& j : jobs("aab", 100ms)) g.spawn(j.key, child_work(h.loop, t, j));
            co_return;
          });
        };
        try {
          co_await sluice::gather(map(*hosts), map(*rate), group(*hosts), group(*rate));
        } catch (...) {
          hosts.reset();
          rate.reset();
          throw;
        }
      });
      CHECK(fan.done);
      CHECK(t.now == 0);
    }
}

TEST_CASE("a start by_key gives back goes to the rate limiter's next waiter at that instant",
          "[by_key][review]") {
  // 1 start per host per second; another caller started a and b at 0 and
  // asks for b again at 10 ms, behind the fan-out's wait for b. "ab", 1 slot:
  // at 1 s both of the fan-out's waits are granted, a takes the slot and b's
  // start is given back, which grants the other caller's b at 1 s (not 2 s);
  // the fan-out's b then waits behind it: 2 s.
  virtual_loop loop;
  trace t;
  sluice::keyed_rate_limiter<char> per_host{loop.get_executor(), 1, 1s};
  nanoseconds other_got{-1};
  bool started_both = false;
  auto other = [&]() -> asio::awaitable<void> {
    co_await sluice::sleep(10ms);
    co_await per_host.acquire('b');
    other_got = loop.now();
  };
  auto fan = [&]() -> asio::awaitable<void> {
    co_await sluice::for_each(
        sluice::map_unordered([&](job j) { return work(loop, t, j); }, jobs("ab", 100ms), 1,
                              sluice::by_key(key_of, per_host)),
        [](int) {});
  };
  loop.run([&]() -> asio::awaitable<void> {
    started_both = per_host.try_acquire('a') && per_host.try_acquire('b');
    co_await sluice::gather(other(), fan());
  });
  CHECK(started_both);
  CHECK(other_got == 1s);
  CHECK(t.starts == std::vector<std::pair<int, nanoseconds>>{{0, 1s}, {1, 2s}});
  CHECK(per_host.stats().acquired == 5);
  CHECK(per_host.waiters('a') + per_host.waiters('b') == 0);
  CHECK(loop.now() == 2100ms);
}

TEST_CASE("by_key with a keyed_rate_limiter that sheds a wait fails with its overloaded_error",
          "[by_key][review]") {
  // 1 start per second, waits bounded to 50 ms. "aa", 2 at once: a0 starts
  // at 0; a1's wait could be granted only at 1 s, so the limiter refuses it
  // at once: the fan-out fails at 0, a0 cancelled, one start counted, no
  // waiter left.
  virtual_loop loop;
  trace t;
  sluice::keyed_rate_limiter<char> per_host{loop.get_executor(), 1, 1s,
                                            sluice::shed_options{.max_wait = 50ms}};
  nanoseconds failed_at{-1};
  std::size_t left_waiting = 9;
  loop.run([&]() -> asio::awaitable<void> {
    try {
      co_await sluice::for_each(
          sluice::map_unordered([&](job j) { return work(loop, t, j); }, jobs("aa", 100ms), 2,
                                sluice::by_key(key_of, per_host)),
          [](int) {});
    } catch (const sluice::overloaded_error&) {
      failed_at = loop.now();
      left_waiting = per_host.waiters('a');
    }
  });
  CHECK(failed_at == 0ms);
  CHECK(left_waiting == 0);
  CHECK(t.starts == std::vector<std::pair<int, nanoseconds>>{{0, 0ms}});
  CHECK(t.cancelled == 1);
  CHECK(per_host.stats().acquired == 1);
}

TEST_CASE(
    "return_exceptions by a keyed limit yields every outcome and frees a failed task's permit",
    "[by_key][review]") {
  // "aab", 2 at once, one permit per host: a0 and b start at 0, a0 fails at
  // 13 ms, its permit goes to a1 at that instant; every outcome comes back.
  for (bool gather : {false, true}) {
    INFO((gather ? "gather_with_concurrency" : "map_unordered"));
    virtual_loop loop;
    trace t;
    shared_hosts s{loop, t};
    std::vector<job> in = jobs("aab", 100ms);
    in[0].took = 13ms;
    std::size_t values = 0, errors = 0;
    auto count = [&](const sluice::outcome<int>& o) {
      ++(o.has_value() ? values : errors);
    };
    loop.run([&]() -> asio::awaitable<void> {
      if (gather) {
        sluice_test::lazy_tasks<asio::awaitable<int>> tasks(
            in.size(), [&](std::size_t i) { return s.task(in[i]); });
        auto got = co_await sluice::gather_with_concurrency(
            2, tasks, sluice::by_key([&](std::size_t i) { return in[i].key; }, s.hosts),
            sluice::return_exceptions);
        for (auto& o : got) count(o);
      } else {
        co_await sluice::for_each(
            sluice::map_unordered([&](job j) { return s.task(j); }, in, 2,
                                  sluice::by_key(key_of, s.hosts), sluice::return_exceptions),
            [&](sluice::outcome<int> o) { count(o); });
      }
    });
    CHECK(values == 2);
    CHECK(errors == 1);
    CHECK(s.unheld == 0);
    CHECK(started(t, 1) == 13ms);
    CHECK(started(t, 2) == 0ms);
    CHECK(loop.now() == 113ms);
    CHECK(s.hosts.keys() == 0);
  }
}
