// SPDX-License-Identifier: BSL-1.0
#include <sluice/gather.hpp>
#include <sluice/keyed_semaphore.hpp>
#include <sluice/queue.hpp>
#include <sluice/stop_source.hpp>
#include <sluice/task_group.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/job_runner.hpp>

#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

using namespace std::chrono_literals;
using sluice::stop_source;
using sluice::task_group;
using sluice::testing::virtual_loop;
using sluice_test::job_state;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace {

// A child that records when it started and how it ended.
struct child_log {
  std::vector<nanoseconds> started, finished, cancelled;
};

asio::awaitable<void> child(virtual_loop& loop, child_log& log, nanoseconds d) {
  log.started.push_back(loop.now());
  try {
    co_await sluice::sleep(d);
  } catch (...) {
    log.cancelled.push_back(loop.now());
    throw;
  }
  log.finished.push_back(loop.now());
}

}  // namespace

TEST_CASE("a stop request lets the running children finish within the grace and drops the waiting",
          "[stop_source]") {
  virtual_loop loop;
  stop_source stop;
  child_log log;
  bool body_ended = false;
  bool refused = false;
  loop.run([&]() -> asio::awaitable<void> {
    co_await task_group::run(
        2,
        [&](task_group& g) -> asio::awaitable<void> {
          g.spawn(child(loop, log, 1s));
          g.spawn(child(loop, log, 2s));
          g.spawn(child(loop, log, 1s));  // waits for a slot: would start at 1 s
          g.spawn(child(loop, log, 1s));
          co_await sluice::sleep(500ms);
          stop.request(5s);
          refused = !g.spawn(child(loop, log, 1s));
          try {
            co_await sluice::sleep(1h);  // the stop cancels the body at once
          } catch (const sluice::system_error&) {
            body_ended = true;
            throw;
          }
        },
        stop);
  });
  CHECK(refused);
  CHECK(body_ended);
  // Both running children finished within the grace; the queued ones never
  // started; run returned when the last one finished, not at the grace's end.
  CHECK(log.started == std::vector<nanoseconds>{0s, 0s});
  CHECK(log.finished == std::vector<nanoseconds>{1s, 2s});
  CHECK(log.cancelled.empty());
  CHECK(loop.now() == 2s);
}

TEST_CASE("a stop request cancels the children still running when the grace ends",
          "[stop_source]") {
  virtual_loop loop;
  stop_source stop;
  child_log log;
  loop.run([&]() -> asio::awaitable<void> {
    co_await task_group::run(
        4,
        [&](task_group& g) -> asio::awaitable<void> {
          g.spawn(child(loop, log, 1s));
          g.spawn(child(loop, log, 10s));
          co_await sluice::sleep(500ms);
          stop.request(2s);
        },
        stop);
  });
  CHECK(log.finished == std::vector<nanoseconds>{1s});
  CHECK(log.cancelled == std::vector<nanoseconds>{2500ms});
  CHECK(loop.now() == 2500ms);
}

TEST_CASE("a stop request with no grace cancels at once, and a later request shortens the grace",
          "[stop_source]") {
  virtual_loop loop;
  child_log log;
  SECTION("no grace") {
    stop_source stop;
    loop.run(task_group::run(
        3,
        [&](task_group& g) -> asio::awaitable<void> {
          g.spawn(child(loop, log, 10s));
          co_await sluice::sleep(1s);
          stop.request();
        },
        stop));
    CHECK(log.cancelled == std::vector<nanoseconds>{1s});
    CHECK(loop.now() == 1s);
  }
  SECTION("a shorter grace replaces a longer one, a longer one changes nothing") {
    stop_source stop;
    loop.run(task_group::run(
        3,
        [&](task_group& g) -> asio::awaitable<void> {
          g.spawn(child(loop, log, 100s));
          // (Parameters, not captures: the lambda object dies before its coroutine.)
          g.spawn([](stop_source& s) -> asio::awaitable<void> {
            co_await sluice::sleep(1s);
            s.request(60s);  // deadline 61 s
            co_await sluice::sleep(1s);
            s.request(5s);  // deadline 7 s
            co_await sluice::sleep(1s);
            s.request(30s);  // deadline 33 s: later, ignored
          }(stop));
          co_return;
        },
        stop));
    CHECK(log.cancelled == std::vector<nanoseconds>{7s});
    CHECK(loop.now() == 7s);
    CHECK(stop.grace() == 5s);
  }
}

TEST_CASE("a group whose stop was requested before run starts nothing", "[stop_source]") {
  virtual_loop loop;
  stop_source stop;
  stop.request(1s);
  bool called = false;
  loop.run(task_group::run(
      2,
      [&](task_group&) -> asio::awaitable<void> {
        called = true;
        co_return;
      },
      stop));
  CHECK(!called);
  CHECK(stop.stop_requested());
}

TEST_CASE("a child failing during the grace fails the group", "[stop_source]") {
  virtual_loop loop;
  stop_source stop;
  child_log log;
  CHECK_THROWS_WITH(loop.run(task_group::run(
                        3,
                        [&](task_group& g) -> asio::awaitable<void> {
                          g.spawn(child(loop, log, 10s));
                          g.spawn([]() -> asio::awaitable<void> {
                            co_await sluice::sleep(2s);
                            throw std::runtime_error("failed in the grace");
                          }());
                          co_await sluice::sleep(1s);
                          stop.request(5s);
                        },
                        stop)),
                    "failed in the grace");
  CHECK(log.cancelled == std::vector<nanoseconds>{2s});  // fail fast, not the grace's end
}

TEST_CASE("one stop source stops several groups", "[stop_source]") {
  virtual_loop loop;
  stop_source stop;
  child_log log;
  auto group = [&]() {
    return task_group::run(
        1,
        [&](task_group& g) -> asio::awaitable<void> {
          g.spawn(child(loop, log, 10s));
          co_return;
        },
        stop);
  };
  loop.run([&]() -> asio::awaitable<void> {
    co_await task_group::run([&](task_group& g) -> asio::awaitable<void> {
      g.spawn(group());
      g.spawn(group());
      co_await sluice::sleep(1s);
      stop.request(1s);
    });
  });
  CHECK(log.cancelled == std::vector<nanoseconds>{2s, 2s});
}

TEST_CASE("a stop source rejects a negative grace", "[stop_source]") {
  stop_source stop;
  CHECK_THROWS_AS(stop.request(-1s), std::invalid_argument);
  CHECK(!stop.stop_requested());
}

TEST_CASE("the job runner stops with a grace and accounts for every job", "[stop_source]") {
  // 30 jobs of 1 s over 3 tenants (one call per tenant at a time), at most 4
  // jobs in the group; stop at 2.5 s with a grace of 1 s.
  virtual_loop loop;
  sluice_test::job_runner r(30, 3, {.latency = sluice::testing::latency::fixed(1s)});
  stop_source stop;
  loop.run([&]() -> asio::awaitable<void> {
    sluice::queue<std::size_t> q;
    for (std::size_t i = 0; i < r.states.size(); ++i) REQUIRE(q.try_put(i));
    sluice::keyed_semaphore<std::string> per_tenant{1};
    auto operator_presses_ctrl_c = [&]() -> asio::awaitable<void> {
      co_await sluice::sleep(2500ms);
      stop.request(1s);
    };
    co_await sluice::gather(
        task_group::run(
            4, [&](task_group& g) { return r.produce(g, q, per_tenant); }, stop),
        operator_presses_ctrl_c());
    CHECK(q.size() == 19);  // jobs 11..29 were never taken
  });
  // 0-2 run 0-1 s and job 3 (tenant 0) waits for job 0; 3-5 run 1-2 s, job 6
  // waits for 3; 6-8 run 2-3 s; job 9 (tenant 0) starts at 2 s, gets its
  // tenant at 3 s and is cancelled at 3.5 s; job 10 was taken at 2 s and
  // refused by the stop at 2.5 s; 11-29 stayed in the queue.
  CHECK(loop.now() == 3500ms);
  CHECK(r.count(job_state::done) == 9);
  CHECK(r.count(job_state::cancelled) == 1);
  CHECK(r.states[9] == job_state::cancelled);
  CHECK(r.count(job_state::running) == 0);
  CHECK(r.count(job_state::taken) == 0);
  CHECK(r.count(job_state::queued) == 20);
  CHECK(r.refused == 1);
  CHECK(r.service.max_in_flight() == 3);
  for (int t = 0; t < 3; ++t) CHECK(r.service.max_in_flight("t" + std::to_string(t)) == 1);
  CHECK(r.service.cancellations() == 1);
  CHECK(r.service.in_flight() == 0);
}

TEST_CASE("a stop with the longest grace lets the running children finish", "[stop_source]") {
  virtual_loop loop;
  stop_source stop;
  child_log log;
  loop.run(task_group::run(
      2,
      [&](task_group& g) -> asio::awaitable<void> {
        g.spawn(child(loop, log, 10s));
        co_await sluice::sleep(1s);
        stop.request(sluice::clock::duration::max());  // the deadline saturates: no wrap
      },
      stop));
  CHECK(log.finished == std::vector<nanoseconds>{10s});
  CHECK(log.cancelled.empty());
}

TEST_CASE("a grace of the clock's range never ends in virtual time: the loop reports the deadlock",
          "[stop_source]") {
  virtual_loop loop;
  stop_source stop;
  // Before, the grace timer fired at the end of time and cancelled the child.
  CHECK_THROWS_AS(loop.run(task_group::run(
                      2,
                      [&](task_group& g) -> asio::awaitable<void> {
                        g.spawn(sluice::sleep(sluice::clock::duration::max()));
                        co_await sluice::sleep(1s);
                        stop.request(std::chrono::hours::max());  // any duration, saturated
                      },
                      stop)),
                  sluice::testing::deadlock_error);
  CHECK(loop.now() == 1s);
}
