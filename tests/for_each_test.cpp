// SPDX-License-Identifier: BSL-1.0
#include <sluice/for_each.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/ending.hpp>
#include <support/service_calls.hpp>
#include <support/spawned.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::slow_service;
using sluice::testing::virtual_loop;
namespace latency = sluice::testing::latency;
using sluice_test::call;
using sluice_test::call_or_fail;
using sluice_test::iota_vec;
using std::chrono::nanoseconds;

namespace {

// Counts the tasks that have started and not yet finished, however they end.
struct live_count {
  std::size_t now = 0, started = 0;
};
struct live_guard {
  live_count* c;
  explicit live_guard(live_count& l) : c(&l) {
    ++c->now;
    ++c->started;
  }
  live_guard(const live_guard&) = delete;
  live_guard& operator=(const live_guard&) = delete;
  ~live_guard() { --c->now; }
};

struct body_failed : std::runtime_error {
  body_failed() : std::runtime_error("the body failed") {}
};

// The loop of issue 7, through for_each: a semaphore and a counter in the
// consumer's frame, used by `[&]` tasks; the body stops after `stop_after`
// results, by returning false or (throw_in_body) by throwing. Reports what
// still ran when for_each returned.
struct scoped_loop_report {
  std::size_t live_at_return = 99, results = 0, started = 0;
  std::string ending;
};

asio::awaitable<scoped_loop_report> scoped_loop(slow_service& svc, bool throw_in_body) {
  scoped_loop_report rep;
  sluice::semaphore backend{2};  // in this frame: freed when this coroutine returns
  live_count live;
  auto work = [&](int i) -> asio::awaitable<int> {
    live_guard g(live);
    auto permit = co_await backend.scoped_acquire();
    co_await svc.call(std::to_string(i));
    co_return i;
  };
  try {
    co_await sluice::for_each(sluice::map_unordered(work, iota_vec(50), 4), [&](int) {
      if (++rep.results == 3) {
        if (throw_in_body) throw body_failed();
        return false;
      }
      return true;
    });
    rep.ending = "ok";
  } catch (const std::exception& e) {
    rep.ending = e.what();
  }
  rep.live_at_return = live.now;
  rep.started = live.started;
  co_return rep;
}

}  // namespace

// ---- the scoped loop ------------------------------------------------------

TEST_CASE("for_each stopped by false returns only after every task finished", "[for_each]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::uniform(100ms, 900ms, 7)});
  auto rep = loop.run(scoped_loop(svc, false));
  CHECK(rep.ending == "ok");
  CHECK(rep.results == 3);
  CHECK(rep.live_at_return == 0);
  CHECK(rep.started > 3);  // tasks were still running (or waiting for a permit) at the stop
  CHECK(svc.in_flight() == 0);
  CHECK(svc.cancellations() > 0);
  loop.poll();  // nothing left to run touches the freed semaphore (ASan)
  CHECK(svc.completed() + svc.cancellations() == svc.calls());
}

TEST_CASE("for_each rethrows the body's exception after every task finished", "[for_each]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::uniform(100ms, 900ms, 7)});
  auto rep = loop.run(scoped_loop(svc, true));
  CHECK(rep.ending == "the body failed");  // not the aborted tasks' operation_aborted
  CHECK(rep.results == 3);
  CHECK(rep.live_at_return == 0);
  CHECK(svc.in_flight() == 0);
  loop.poll();
  CHECK(svc.completed() + svc.cancellations() == svc.calls());
}

TEST_CASE("for_each rethrows a task's failure with nothing running", "[for_each]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(1s)});
  std::vector<int> seen;
  auto how = loop.run(sluice_test::ending_of(sluice::for_each(
      sluice::map_unordered([&](int i) { return call_or_fail(svc, i, 4); }, iota_vec(10), 3),
      [&](int r) { seen.push_back(r); })));
  CHECK(how == "task 4 failed");
  CHECK(seen == std::vector<int>{0, 1, 2, 3});
  CHECK(svc.in_flight() == 0);
  CHECK(loop.now() == 2s);
}

TEST_CASE("for_each over chained streams stops both stages before it returns", "[for_each]") {
  virtual_loop loop;
  slow_service fetch({.latency = latency::from(
                          [](const auto& c) -> nanoseconds { return c.index < 2 ? 1s : 10s; })});
  slow_service store({.latency = latency::from(
                          [](const auto& c) -> nanoseconds { return c.index == 0 ? 2s : 5s; })});
  std::size_t got = 0;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(
        sluice::map_unordered(
            [&](int i) { return call(store, i); },
            sluice::map_unordered([&](int i) { return call(fetch, i); }, iota_vec(100), 8), 2),
        [&](int) {
          ++got;
          return false;
        });
    // Stopped at 3 s: store 1 (1..6 s) and fetches 2..9 (..10 s+) were running.
    CHECK(loop.now() == 3s);
    CHECK(fetch.in_flight() == 0);
    CHECK(store.in_flight() == 0);
  });
  CHECK(got == 1);
  CHECK(fetch.cancellations() == 8);
  CHECK(store.cancellations() == 1);
  const auto calls = fetch.calls() + store.calls();
  loop.run([]() -> asio::awaitable<void> { co_await sluice::sleep(10s); });
  CHECK(fetch.calls() + store.calls() == calls);
}

// ---- body shapes ----------------------------------------------------------

TEST_CASE("a void body sees every result in completion order", "[for_each]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::sequence({300ms, 100ms, 200ms})});
  std::vector<int> seen;
  loop.run(sluice::for_each(
      sluice::map_unordered([&](int i) { return call(svc, i); }, std::vector{0, 1, 2}, 3),
      [&](int r) { seen.push_back(r); }));
  CHECK(seen == std::vector<int>{1, 2, 0});
  CHECK(loop.now() == 300ms);
}

TEST_CASE("a bool body stops at false", "[for_each]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(100ms)});
  std::vector<int> seen;
  loop.run(sluice::for_each(
      sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(10), 1), [&](int r) {
        seen.push_back(r);
        return r != 2;
      }));
  CHECK(seen == std::vector<int>{0, 1, 2});
  CHECK(svc.in_flight() == 0);
  // Handing out 2 freed its slot, but for_each closed the stream before the
  // woken worker could pull 3.
  CHECK(svc.calls() == 3);
  CHECK(loop.now() == 300ms);
}

TEST_CASE("an awaitable<void> body is awaited before the next result is read", "[for_each]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(100ms)});
  std::vector<nanoseconds> at;
  loop.run(sluice::for_each(
      sluice::map_unordered([&](int i) { return call(svc, i); }, std::vector{0, 1, 2}, 1),
      [&](int) -> asio::awaitable<void> {
        at.push_back(loop.now());
        co_await sluice::sleep(100ms);
      }));
  // Item 3 of issue 7 too: the next task runs while the body works.
  CHECK(at == std::vector<nanoseconds>{100ms, 200ms, 300ms});
  CHECK(loop.now() == 400ms);
}

TEST_CASE("an awaitable<bool> body stops at false", "[for_each]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(100ms)});
  std::vector<int> seen;
  loop.run(sluice::for_each(sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(10),
                                                  2, sluice::return_exceptions),
                            [&](sluice::outcome<int> r) -> asio::awaitable<bool> {
                              co_await sluice::sleep(10ms);
                              seen.push_back(r.value());
                              co_return seen.size() < 4;
                            }));
  CHECK(seen.size() == 4);
  CHECK(svc.in_flight() == 0);
}

TEST_CASE("for_each accepts bodies of the four shapes and nothing else", "[for_each]") {
  using ex = asio::any_io_executor;
  auto v = [](int) {
  };
  auto b = [](int) {
    return true;
  };
  auto av = [](int) -> asio::awaitable<void> {
    co_return;
  };
  auto ab = [](const int&) -> asio::awaitable<bool> {
    co_return true;
  };
  auto i = [](int) {
    return 1;
  };
  auto s = [](std::string) {
  };
  auto lv = [](int&) {
  };
  STATIC_REQUIRE(sluice::for_each_body<decltype(v), int, ex>);
  STATIC_REQUIRE(sluice::for_each_body<decltype(b), int, ex>);
  STATIC_REQUIRE(sluice::for_each_body<decltype(av), int, ex>);
  STATIC_REQUIRE(sluice::for_each_body<decltype(ab), int, ex>);
  STATIC_REQUIRE_FALSE(sluice::for_each_body<decltype(i), int, ex>);
  STATIC_REQUIRE_FALSE(sluice::for_each_body<decltype(s), int, ex>);
  STATIC_REQUIRE_FALSE(sluice::for_each_body<decltype(lv), int, ex>);
}

// ---- cancellation of the caller ------------------------------------------

TEST_CASE("cancelling the caller during the body cancels the tasks and waits for them",
          "[for_each]") {
  sluice_test::tasks_on_loop t;
  slow_service svc({.latency = latency::fixed(1s)});
  live_count live;
  std::size_t live_at_end = 99, in_flight_at_end = 99;
  std::string how;
  auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
    auto work = [&](int i) -> asio::awaitable<int> {
      live_guard g(live);
      co_return co_await call(svc, i);
    };
    how = co_await sluice_test::ending_of(
        sluice::for_each(sluice::map_unordered(work, iota_vec(20), 3),
                         [&](int) -> asio::awaitable<void> { co_await sluice::sleep(10s); }));
    live_at_end = live.now;
    in_flight_at_end = svc.in_flight();
  });
  t.loop.run_for(1500ms);  // the body works on result 0; 1 and 2 wait unread; 3 runs
  CHECK(svc.in_flight() == 1);
  consumer.cancel();
  t.poll();
  CHECK(consumer.done);
  CHECK(how == "aborted");
  CHECK(live_at_end == 0);
  CHECK(in_flight_at_end == 0);
  CHECK(t.loop.now() == 1500ms);
}

TEST_CASE("cancelling the caller while for_each waits for a result cancels and waits",
          "[for_each]") {
  sluice_test::tasks_on_loop t;
  slow_service svc({.latency = latency::fixed(1s)});
  std::size_t in_flight_at_end = 99;
  std::string how;
  auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
    how = co_await sluice_test::ending_of(sluice::for_each(
        sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(20), 3), [](int) {}));
    in_flight_at_end = svc.in_flight();
  });
  t.loop.run_for(1500ms);
  consumer.cancel();
  t.poll();
  CHECK(how == "aborted");
  CHECK(in_flight_at_end == 0);
}

TEST_CASE("a caller cancelled before it calls for_each starts nothing", "[for_each]") {
  sluice_test::tasks_on_loop t;
  slow_service svc({.latency = latency::fixed(1s)});
  std::string how_on, how_off;
  bool body_ran = false;
  auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
    try {
      co_await sluice::sleep(1s);
    } catch (...) {
    }
    // throw_if_cancelled on (the default): Asio throws at the co_await.
    how_on = co_await sluice_test::ending_of(
        sluice::for_each(sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(5), 2),
                         [&](int) { body_ran = true; }));
  });
  auto& off = t.spawn([&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      co_await sluice::sleep(1s);
    } catch (...) {
    }
    // throw_if_cancelled off: for_each itself sees the cancellation.
    how_off = co_await sluice_test::ending_of(
        sluice::for_each(sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(5), 2),
                         [&](int) { body_ran = true; }));
  });
  t.poll();
  consumer.cancel();
  off.cancel();
  t.poll();
  CHECK(consumer.done);
  CHECK(off.done);
  CHECK(how_off == "aborted");
  CHECK_FALSE(body_ran);
  CHECK(svc.calls() == 0);
  (void)how_on;  // ending_of itself is refused by Asio here; the task ends aborted
  CHECK(consumer.cancelled());
}

TEST_CASE("a started stream handed to for_each by a cancelled caller is closed and waited for",
          "[for_each]") {
  sluice_test::tasks_on_loop t;
  slow_service svc({.latency = latency::fixed(1s)});
  std::string how;
  std::size_t in_flight_at_end = 99;
  auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(20), 3);
    auto first = co_await s.next();  // at 1 s; 1 and 2 wait unread, 3 starts
    CHECK(first == 0);
    try {
      co_await sluice::sleep(10s);  // cancelled at 1.5 s
    } catch (...) {
    }
    how = co_await sluice_test::ending_of(sluice::for_each(std::move(s), [](int) {}));
    in_flight_at_end = svc.in_flight();
  });
  t.loop.run_for(1500ms);
  CHECK(svc.in_flight() == 1);
  consumer.cancel();
  t.poll();
  CHECK(consumer.done);
  CHECK(how == "aborted");
  CHECK(in_flight_at_end == 0);
  CHECK(svc.cancellations() == 1);
  CHECK(t.loop.now() == 1500ms);
}

// ---- results already waiting (taken without a next() frame) ----------------

TEST_CASE("for_each hands out a burst of waiting results in the order next() does", "[for_each]") {
  // Ties: several tasks finish at the same instant, so results wait in the
  // buffer and for_each takes them without suspending.
  const auto latencies = latency::sequence({300ms, 100ms, 100ms, 200ms, 100ms, 300ms, 100ms});
  auto via_next = [&] {
    virtual_loop loop;
    slow_service svc({.latency = latencies});
    std::vector<int> seen;
    loop.run([&]() -> asio::awaitable<void> {
      auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(20), 5);
      while (auto r = co_await s.next()) seen.push_back(*r);
    });
    return seen;
  };
  auto via_for_each = [&] {
    virtual_loop loop;
    slow_service svc({.latency = latencies});
    std::vector<int> seen;
    loop.run(sluice::for_each(
        sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(20), 5),
        [&](int r) { seen.push_back(r); }));
    return seen;
  };
  const auto expected = via_next();
  CHECK(expected.size() == 20);
  CHECK(via_for_each() == expected);
}

TEST_CASE("while for_each drains a burst each result frees its slot at once and no more",
          "[for_each]") {
  // Limit 3, every task 1 s: results come in bursts of 3. The awaitable body
  // works 100 ms on each, so the next input starts when a result is taken
  // (not before, not when the body ends).
  virtual_loop loop;
  std::vector<nanoseconds> started;
  std::size_t handed_out = 0, most_in_flight = 0;
  auto work = [&](int i) -> asio::awaitable<int> {
    started.push_back(loop.now());
    most_in_flight = std::max(most_in_flight, started.size() - handed_out);
    co_await sluice::sleep(1s);
    co_return i;
  };
  loop.run(sluice::for_each(sluice::map_unordered(work, iota_vec(6), 3),
                            [&](int) -> asio::awaitable<void> {
                              ++handed_out;
                              co_await sluice::sleep(100ms);
                            }));
  CHECK(handed_out == 6);
  CHECK(most_in_flight == 3);  // started and not handed out: never above the limit
  CHECK(started == std::vector<nanoseconds>{0ms, 0ms, 0ms, 1000ms, 1100ms, 1200ms});
}

TEST_CASE("a body that cancels its own caller midway through a burst stops at once", "[for_each]") {
  // Limit 6: tasks 0..3 take 1 s, 4 and 5 take 5 s. At 1 s results 0..3
  // wait in the buffer; the body cancels the caller on the second one.
  sluice_test::tasks_on_loop t;
  slow_service svc({.latency = latency::from(
                        [](const auto& c) -> nanoseconds { return c.index < 4 ? 1s : 5s; })});
  std::vector<int> seen;
  std::string how;
  std::size_t in_flight_at_end = 99;
  nanoseconds ended_at{};
  sluice_test::task* self = nullptr;
  auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
    how = co_await sluice_test::ending_of(sluice::for_each(
        sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(20), 6), [&](int r) {
          seen.push_back(r);
          if (seen.size() == 2) self->cancel();  // 2 and 3 still wait in the buffer
        }));
    in_flight_at_end = svc.in_flight();
    ended_at = t.loop.now();
  });
  self = &consumer;
  t.loop.run_for(1500ms);
  CHECK(consumer.done);
  CHECK(how == "aborted");
  CHECK(seen == std::vector<int>{0, 1});  // not one result after the cancellation
  CHECK(in_flight_at_end == 0);
  // 4 and 5 were cancelled and waited for; the slots freed by taking 0 and 1
  // pulled nothing (the stream was stopped before a worker could).
  CHECK(svc.calls() == 6);
  CHECK(svc.cancellations() == 2);
  CHECK(ended_at == 1s);
}

TEST_CASE("a caller cancelled with throw_if_cancelled off stops before a waiting result",
          "[for_each]") {
  // The stream was started by next(); 1 and 2 wait in the buffer when the
  // cancelled caller hands it to for_each: no body runs.
  sluice_test::tasks_on_loop t;
  slow_service svc({.latency = latency::fixed(1s)});
  std::string how;
  bool body_ran = false;
  auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(20), 3);
    auto first = co_await s.next();  // at 1 s
    CHECK(first == 0);
    try {
      co_await sluice::sleep(10s);  // cancelled at 1.5 s
    } catch (...) {
    }
    how = co_await sluice_test::ending_of(
        sluice::for_each(std::move(s), [&](int) { body_ran = true; }));
  });
  t.loop.run_for(1500ms);
  consumer.cancel();
  t.poll();
  CHECK(consumer.done);
  CHECK(how == "aborted");
  CHECK_FALSE(body_ran);
  CHECK(svc.in_flight() == 0);
}
