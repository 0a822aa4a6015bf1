// SPDX-License-Identifier: BSL-1.0
#include <sluice/task_group.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>
#include <sluice/timeout.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/ending.hpp>
#include <support/lifetime.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

using namespace std::chrono_literals;
using sluice::task_group;
using sluice::testing::slow_service;
using sluice::testing::virtual_loop;
namespace latency = sluice::testing::latency;
using std::chrono::nanoseconds;

namespace {

// Counts the children that started and have not finished: a child holds one
// for its whole run, so `alive == 0` after run() means no child outlived it.
struct census {
  int started = 0;
  int finished = 0;
  int alive() const { return started - finished; }
};

struct presence {
  census& c;
  explicit presence(census& x) : c(x) { ++c.started; }
  presence(const presence&) = delete;
  presence& operator=(const presence&) = delete;
  ~presence() { ++c.finished; }
};

// Lives as long as the awaitable that holds it (a coroutine parameter).
struct frame_token {
  int* live;
  explicit frame_token(int& n) : live(&n) { ++*live; }
  frame_token(frame_token&& o) noexcept : live(o.live) { ++*live; }
  frame_token(const frame_token&) = delete;
  ~frame_token() { --*live; }
};

asio::awaitable<void> sleeper(census& c, nanoseconds d) {
  presence p(c);
  co_await sluice::sleep(d);
}

asio::awaitable<void> failer(census& c, nanoseconds d, std::string what) {
  presence p(c);
  co_await sluice::sleep(d);
  throw std::runtime_error(what);
}

// Ignores cancellation for `d`, then finishes.
asio::awaitable<void> stubborn(census& c, nanoseconds d) {
  presence p(c);
  co_await asio::this_coro::reset_cancellation_state(
      [](asio::cancellation_type) { return asio::cancellation_type::none; });
  co_await sluice::sleep(d);
}

// One call to the service, counted.
asio::awaitable<void> call_child(census& c, slow_service& svc) {
  presence p(c);
  co_await svc.call();
}

// Counted, finishes at once.
asio::awaitable<void> counted(frame_token, census& c) {
  presence p(c);
  co_return;
}

asio::awaitable<void> mark_started(frame_token, bool& started) {
  started = true;
  co_return;
}

}  // namespace

TEST_CASE("a crawler that discovers 500 pages while running, limit 8, keeps 8 in flight",
          "[task_group]") {
  slow_service site({.latency = latency::uniform(50ms, 150ms, 3)});
  virtual_loop loop;
  census c;
  std::size_t discovered = 1;  // the root
  std::size_t max_running = 0;
  std::size_t max_size = 0;
  // Declared outside the body: the body's own locals end when it returns,
  // while the crawl goes on.
  std::function<asio::awaitable<void>(task_group&, std::size_t)> page;
  page = [&](task_group& g, std::size_t id) -> asio::awaitable<void> {
    presence p(c);
    max_running = std::max(max_running, g.running());
    co_await site.call("page" + std::to_string(id));
    for (int k = 0; k < 3 && discovered < 500; ++k) g.spawn(page(g, discovered++));
    max_size = std::max(max_size, g.size());
  };
  loop.run(task_group::run(8, [&](task_group& g) -> asio::awaitable<void> {
    g.spawn(page(g, 0));
    co_return;  // the crawl goes on after the body returned
  }));
  CHECK(discovered == 500);
  CHECK(c.started == 500);
  CHECK(c.finished == 500);
  CHECK(site.calls() == 500);
  CHECK(site.completed() == 500);
  CHECK(site.max_in_flight() == 8);
  CHECK(max_running == 8);
  CHECK(max_size > 8);  // children did wait for a slot
  CHECK(site.in_flight() == 0);
}

TEST_CASE("children beyond the limit wait in FIFO order and no frame of theirs runs early",
          "[task_group]") {
  virtual_loop loop;
  std::vector<std::pair<int, nanoseconds>> starts;
  std::size_t running_after_spawn = 0, size_after_spawn = 0;
  int started_inside_body = -1;
  std::function<asio::awaitable<void>(int)> record_start = [&](int i) -> asio::awaitable<void> {
    starts.emplace_back(i, loop.now());
    co_await sluice::sleep(1s);
  };
  loop.run(task_group::run(2, [&](task_group& g) -> asio::awaitable<void> {
    for (int i = 0; i < 5; ++i) g.spawn(record_start(i));
    running_after_spawn = g.running();
    size_after_spawn = g.size();
    started_inside_body = static_cast<int>(starts.size());  // the first two started at once
    co_return;
  }));
  CHECK(started_inside_body == 2);
  CHECK(running_after_spawn == 2);
  CHECK(size_after_spawn == 5);
  REQUIRE(starts.size() == 5);
  const std::vector<std::pair<int, nanoseconds>> expected{
      {0, 0s}, {1, 0s}, {2, 1s}, {3, 1s}, {4, 2s}};
  CHECK(starts == expected);
  CHECK(loop.now() == 3s);
}

TEST_CASE("run completes only when the body and every child have finished", "[task_group]") {
  virtual_loop loop;
  census c;
  // Spawns a grandchild after the body returned.
  std::function<asio::awaitable<void>(task_group&)> parent =
      [&](task_group& g) -> asio::awaitable<void> {
    presence p(c);
    co_await sluice::sleep(2s);
    g.spawn(sleeper(c, 2s));
  };
  loop.run(task_group::run([&](task_group& g) -> asio::awaitable<void> {
    g.spawn(sleeper(c, 3s));
    g.spawn(parent(g));
    co_await sluice::sleep(1s);
  }));
  CHECK(loop.now() == 4s);
  CHECK(c.started == 3);
  CHECK(c.alive() == 0);
}

TEST_CASE("fail fast: 100 running children are cancelled and finished before run throws",
          "[task_group]") {
  slow_service svc({.latency = latency::fixed(10s)});
  virtual_loop loop;
  census c;
  int alive_at_throw = -1;
  auto how = loop.run([&]() -> asio::awaitable<std::string> {
    auto r = co_await sluice_test::ending_of(
        task_group::run([&](task_group& g) -> asio::awaitable<void> {
          for (int i = 0; i < 100; ++i) g.spawn(call_child(c, svc));
          g.spawn(failer(c, 1s, "boom"));
          co_return;
        }));
    alive_at_throw = c.alive();
    co_return r;
  });
  CHECK(how == "boom");
  CHECK(alive_at_throw == 0);
  CHECK(c.started == 101);
  CHECK(svc.calls() == 100);
  CHECK(svc.cancellations() == 100);
  CHECK(svc.in_flight() == 0);
  CHECK(loop.now() == 1s);
}

TEST_CASE("a failure of the body cancels the children and is rethrown after they finished",
          "[task_group]") {
  virtual_loop loop;
  census c;
  auto how =
      loop.run(sluice_test::ending_of(task_group::run([&](task_group& g) -> asio::awaitable<void> {
        g.spawn(sleeper(c, 10s));
        g.spawn(sleeper(c, 10s));
        co_await sluice::sleep(1s);
        throw std::runtime_error("body failed");
      })));
  CHECK(how == "body failed");
  CHECK(c.alive() == 0);
  CHECK(loop.now() == 1s);
}

TEST_CASE("a child failure cancels the body too", "[task_group]") {
  virtual_loop loop;
  census c;
  bool body_finished_sleep = false;
  auto how =
      loop.run(sluice_test::ending_of(task_group::run([&](task_group& g) -> asio::awaitable<void> {
        g.spawn(failer(c, 1s, "child failed"));
        co_await sluice::sleep(10s);
        body_finished_sleep = true;
      })));
  CHECK(how == "child failed");
  CHECK_FALSE(body_finished_sleep);
  CHECK(loop.now() == 1s);
}

TEST_CASE("run waits for a child that ignores cancellation for a while", "[task_group]") {
  virtual_loop loop;
  census c;
  auto how =
      loop.run(sluice_test::ending_of(task_group::run([&](task_group& g) -> asio::awaitable<void> {
        g.spawn(stubborn(c, 3s));
        g.spawn(sleeper(c, 10s));
        g.spawn(failer(c, 1s, "boom"));
        co_return;
      })));
  CHECK(how == "boom");
  CHECK(c.alive() == 0);
  CHECK(loop.now() == 3s);
}

TEST_CASE("spawn after a failure does not start the task and destroys it unstarted",
          "[task_group]") {
  virtual_loop loop;
  census c;
  int frames = 0;
  bool late_started = false;
  bool accepted = true;
  std::size_t size_after = 99;
  std::function<asio::awaitable<void>(task_group&)> late_spawner =
      [&](task_group& g) -> asio::awaitable<void> {
    presence p(c);
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      co_await sluice::sleep(10s);
    } catch (const sluice::system_error&) {
    }
    // Cancelled by the sibling's failure: the group is stopping.
    accepted = g.spawn(mark_started(frame_token(frames), late_started));
    size_after = g.size();
  };
  auto how =
      loop.run(sluice_test::ending_of(task_group::run([&](task_group& g) -> asio::awaitable<void> {
        g.spawn(late_spawner(g));
        g.spawn(failer(c, 1s, "boom"));
        co_return;
      })));
  CHECK(how == "boom");
  CHECK_FALSE(accepted);
  CHECK_FALSE(late_started);
  CHECK(frames == 0);      // the unstarted awaitable was destroyed at once
  CHECK(size_after == 1);  // only the spawning child itself
  CHECK(c.alive() == 0);
}

TEST_CASE("children waiting for a slot are dropped unstarted when a child fails", "[task_group]") {
  virtual_loop loop;
  census c;
  int frames = 0;
  auto how = loop.run(
      sluice_test::ending_of(task_group::run(1, [&](task_group& g) -> asio::awaitable<void> {
        g.spawn(failer(c, 1s, "boom"));
        for (int i = 0; i < 5; ++i) g.spawn(counted(frame_token(frames), c));
        co_return;
      })));
  CHECK(how == "boom");
  CHECK(c.started == 1);
  CHECK(frames == 0);
  CHECK(loop.now() == 1s);
}

TEST_CASE(
    "cancelling the caller cancels every child, waits for them, and throws "
    "operation_aborted",
    "[task_group]") {
  slow_service svc({.latency = latency::fixed(10s)});
  virtual_loop loop;
  census c;
  asio::cancellation_signal cancel;
  std::string how;
  nanoseconds done_at{-1};
  asio::co_spawn(
      loop.get_executor(),
      sluice_test::ending_of(task_group::run(3,
                                             [&](task_group& g) -> asio::awaitable<void> {
                                               g.spawn(stubborn(c, 5s));
                                               for (int i = 0; i < 6; ++i)
                                                 g.spawn(call_child(c, svc));
                                               co_return;
                                             })),
      sluice_test::bind_slot(cancel.slot(), [&](std::exception_ptr, std::string s) {
        how = s;
        done_at = loop.now();
      }));
  loop.run_for(2s);
  CHECK(c.alive() == 3);
  cancel.emit(asio::cancellation_type::terminal);
  loop.run_for(20s);
  CHECK(how == "aborted");
  CHECK(done_at == 5s);  // it waited for the stubborn child
  CHECK(c.alive() == 0);
  CHECK(c.started == 3);  // the waiting ones never started
  CHECK(svc.cancellations() == 2);
  CHECK(svc.calls() == 2);  // and nothing started later
}

TEST_CASE("a timeout around run stops the group at the deadline with nothing left running",
          "[task_group]") {
  using namespace asio::experimental::awaitable_operators;
  slow_service svc({.latency = latency::fixed(10s)});
  virtual_loop loop;
  census c;
  auto r = loop.run([&]() -> asio::awaitable<std::size_t> {
    auto v = co_await (task_group::run(4,
                                       [&](task_group& g) -> asio::awaitable<void> {
                                         for (int i = 0; i < 8; ++i) g.spawn(call_child(c, svc));
                                         co_return;
                                       }) ||
                       sluice::sleep(2s));
    co_return v.index();
  });
  CHECK(r == 1);
  CHECK(loop.now() == 2s);
  CHECK(c.alive() == 0);
  CHECK(svc.in_flight() == 0);
  CHECK(svc.cancellations() == 4);
}

TEST_CASE("a caller cancelled before it called run starts nothing and throws operation_aborted",
          "[task_group]") {
  virtual_loop loop;
  asio::cancellation_signal cancel;
  bool body_called = false;
  std::string how;
  asio::co_spawn(
      loop.get_executor(),
      [&]() -> asio::awaitable<std::string> {
        // The request arrives while the caller sleeps; it then calls run
        // with throw_if_cancelled off, so only run's own check can refuse.
        co_await asio::this_coro::throw_if_cancelled(false);
        try {
          co_await sluice::sleep(1h);
        } catch (const sluice::system_error&) {
        }
        co_return co_await sluice_test::ending_of(
            task_group::run([&](task_group&) -> asio::awaitable<void> {
              body_called = true;
              co_return;
            }));
      },
      sluice_test::bind_slot(cancel.slot(), [&](std::exception_ptr e, std::string s) {
        how = e ? sluice_test::ending_of_exception(e) : s;
      }));
  loop.poll();
  cancel.emit(asio::cancellation_type::terminal);
  loop.run_for(1s);
  CHECK(how == "aborted");
  CHECK_FALSE(body_called);
}

TEST_CASE("limit 0 throws invalid_argument before the body is called", "[task_group]") {
  bool body_called = false;
  auto body = [&](task_group&) -> asio::awaitable<void> {
    body_called = true;
    co_return;
  };
  CHECK_THROWS_AS((void)task_group::run(0, body), std::invalid_argument);
  CHECK_FALSE(body_called);
}

TEST_CASE("an empty body completes at once", "[task_group]") {
  virtual_loop loop;
  loop.run(task_group::run([](task_group&) -> asio::awaitable<void> { co_return; }));
  CHECK(loop.now() == 0s);
}

TEST_CASE("the body's captures live until every child has finished", "[task_group]") {
  virtual_loop loop;
  int frames = 0;
  int live_at_child_end = -1;
  std::function<asio::awaitable<void>()> child = [&]() -> asio::awaitable<void> {
    co_await sluice::sleep(2s);
    live_at_child_end = frames;
  };
  loop.run(task_group::run(
      [&, token = std::make_shared<frame_token>(frames)](task_group& g) -> asio::awaitable<void> {
        g.spawn(child());
        co_return;
      }));
  CHECK(live_at_child_end == 1);
  CHECK(frames == 0);
}

TEST_CASE("run leaves the caller's throw_if_cancelled switch as it found it", "[task_group]") {
  virtual_loop loop;
  census c;
  auto r = loop.run([&]() -> asio::awaitable<std::pair<bool, bool>> {
    co_await asio::this_coro::throw_if_cancelled(false);
    co_await task_group::run([&](task_group& g) -> asio::awaitable<void> {
      g.spawn(sleeper(c, 1s));
      co_return;
    });
    const bool after_off = co_await asio::this_coro::throw_if_cancelled();
    co_await asio::this_coro::throw_if_cancelled(true);
    co_await task_group::run([&](task_group& g) -> asio::awaitable<void> {
      g.spawn(sleeper(c, 1s));
      co_return;
    });
    const bool after_on = co_await asio::this_coro::throw_if_cancelled();
    co_return std::pair<bool, bool>(after_off, after_on);
  });
  CHECK_FALSE(r.first);
  CHECK(r.second);
}

TEST_CASE("spawn_when_ready waits for a free slot instead of queueing", "[task_group]") {
  virtual_loop loop;
  census c;
  std::vector<nanoseconds> accepted;
  std::size_t most_held = 0;
  loop.run(task_group::run(2, [&](task_group& g) -> asio::awaitable<void> {
    for (int i = 0; i < 5; ++i) {
      const bool ok = co_await g.spawn_when_ready(sleeper(c, 1s));
      CHECK(ok);
      accepted.push_back(loop.now());
      most_held = std::max(most_held, g.size());
    }
  }));
  // Slots free at 1 s (two) and 2 s (two): nothing ever waits in the group.
  CHECK(accepted == std::vector<nanoseconds>{0s, 0s, 1s, 1s, 2s});
  CHECK(most_held == 2);
  CHECK(c.started == 5);
  CHECK(c.alive() == 0);
  CHECK(loop.now() == 3s);
}

TEST_CASE("spawn_when_ready serves children queued by spawn first, then producers in order",
          "[task_group]") {
  virtual_loop loop;
  std::vector<std::string> order;
  auto named = [&](std::string name) {
    return [](std::vector<std::string>& o, std::string n) -> asio::awaitable<void> {
      o.push_back(n);
      co_await sluice::sleep(1s);
    }(order, std::move(name));
  };
  loop.run(task_group::run(2, [&](task_group& g) -> asio::awaitable<void> {
    g.spawn(named("a"));
    g.spawn(named("b"));
    g.spawn(named("c"));  // queued
    const bool ok = co_await g.spawn_when_ready(named("p"));
    CHECK(ok);
    CHECK(loop.now() == 1s);
  }));
  CHECK(order == std::vector<std::string>{"a", "b", "c", "p"});
  CHECK(loop.now() == 2s);
}

TEST_CASE("a cancelled spawn_when_ready starts nothing and loses no slot", "[task_group]") {
  virtual_loop loop;
  census c;
  bool a_ran = false;
  nanoseconds b_started{-1};
  loop.run(task_group::run(2, [&](task_group& g) -> asio::awaitable<void> {
    g.spawn(sleeper(c, 1s));
    g.spawn(sleeper(c, 2s));
    auto a = [](bool& ran) -> asio::awaitable<void> {
      ran = true;
      co_return;
    }(a_ran);
    bool timed_out = false;
    try {
      co_await sluice::with_timeout(500ms, g.spawn_when_ready(std::move(a)));
    } catch (const sluice::timeout_error&) {
      timed_out = true;
    }
    CHECK(timed_out);
    CHECK(g.producers_waiting() == 0);
    auto b = [](virtual_loop& l, nanoseconds& at) -> asio::awaitable<void> {
      at = l.now();
      co_return;
    }(loop, b_started);
    const bool ok = co_await g.spawn_when_ready(std::move(b));
    CHECK(ok);
  }));
  CHECK(!a_ran);
  CHECK(b_started == 1s);  // the slot freed at 1 s went to the next producer
  CHECK(c.alive() == 0);
}

TEST_CASE("spawn_when_ready returns false once the group stops, its child never started",
          "[task_group]") {
  virtual_loop loop;
  census c;
  bool ran = false;
  std::optional<bool> waiting_result;
  CHECK_THROWS_WITH(loop.run(task_group::run(2,
                                             [&](task_group& g) -> asio::awaitable<void> {
                                               g.spawn(sleeper(c, 10s));
                                               g.spawn([]() -> asio::awaitable<void> {
                                                 co_await sluice::sleep(1s);
                                                 throw std::runtime_error("child failed");
                                               }());
                                               auto t = [](bool& r) -> asio::awaitable<void> {
                                                 r = true;
                                                 co_return;
                                               }(ran);
                                               waiting_result =
                                                   co_await g.spawn_when_ready(std::move(t));
                                             })),
                    "child failed");
  CHECK(!ran);
  CHECK(waiting_result == false);
  CHECK(c.alive() == 0);
  CHECK(loop.now() == 1s);
}

TEST_CASE("spawn_when_ready from a caller cancelled before the call starts nothing",
          "[task_group]") {
  virtual_loop loop;
  bool ran = false;
  bool threw = false;
  bool producer_done = false;
  asio::cancellation_signal cancel;
  loop.run(task_group::run(1, [&](task_group& g) -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    // A producer of our own, cancelled (terminal) before it calls; it keeps
    // running because it turned throw_if_cancelled off.
    asio::co_spawn(
        ex,
        [&]() -> asio::awaitable<void> {
          co_await asio::this_coro::throw_if_cancelled(false);
          try {
            co_await sluice::sleep(1h);
          } catch (const sluice::system_error&) {
          }
          auto child = [](bool& r) -> asio::awaitable<void> {
            r = true;
            co_return;
          }(ran);
          try {
            co_await g.spawn_when_ready(std::move(child));
          } catch (const sluice::system_error& e) {
            threw = e.code() == asio::error::operation_aborted;
          }
        },
        sluice_test::bind_slot(cancel.slot(), [&](std::exception_ptr) { producer_done = true; }));
    co_await sluice::sleep(1s);
    cancel.emit(asio::cancellation_type::terminal);
    while (!producer_done) co_await sluice::sleep(1s);
  }));
  CHECK(threw);
  CHECK(!ran);
}

TEST_CASE(
    "a child that cancels the caller while spawn starts it stops the group at once, not after "
    "the child's hour",
    "[task_group]") {
  // The child runs inline inside spawn (inside run) and there requests the
  // caller's cancellation: no cancellation handler of run's join exists yet,
  // so run must look at the caller's state itself once the body has started.
  for (bool throwing : {true, false}) {
    virtual_loop loop;
    slow_service svc({.latency = latency::fixed(1h)});
    census c;
    asio::cancellation_signal cancel;
    std::string how;
    nanoseconds returned_at{-1};
    std::size_t in_flight_at_return = 99;
    auto cancels_its_caller = [&]() -> asio::awaitable<void> {
      presence p(c);
      cancel.emit(asio::cancellation_type::terminal);
      co_await svc.call();
    };
    asio::co_spawn(
        loop.get_executor(),
        [&]() -> asio::awaitable<std::string> {
          co_await asio::this_coro::throw_if_cancelled(throwing);
          co_return co_await sluice_test::ending_of(
              task_group::run([&](task_group& g) -> asio::awaitable<void> {
                g.spawn(call_child(c, svc));
                g.spawn(cancels_its_caller());
                co_await sluice::sleep(1h);
              }));
        },
        sluice_test::bind_slot(cancel.slot(), [&](std::exception_ptr e, std::string s) {
          how = e ? sluice_test::ending_of_exception(e) : s;
          returned_at = loop.now();
          in_flight_at_return = svc.in_flight();
        }));
    loop.run_for(2h);
    CHECK(how == "aborted");
    CHECK(returned_at == 0s);
    CHECK(in_flight_at_return == 0);
    CHECK(svc.cancellations() == 2);
    CHECK(c.alive() == 0);
  }
}

TEST_CASE("a body that cancels its caller and ends at once still makes run throw operation_aborted",
          "[task_group]") {
  virtual_loop loop;
  asio::cancellation_signal cancel;
  std::string how;
  asio::co_spawn(
      loop.get_executor(),
      [&]() -> asio::awaitable<std::string> {
        co_await asio::this_coro::throw_if_cancelled(false);
        co_return co_await sluice_test::ending_of(
            task_group::run([&](task_group&) -> asio::awaitable<void> {
              cancel.emit(asio::cancellation_type::terminal);
              co_return;
            }));
      },
      sluice_test::bind_slot(cancel.slot(), [&](std::exception_ptr e, std::string s) {
        how = e ? sluice_test::ending_of_exception(e) : s;
      }));
  loop.run_for(1s);
  CHECK(how == "aborted");
}

TEST_CASE("an io_context destroyed while run() waits for its children frees the waiting frames",
          "[task_group][lifetime]") {
  using sluice_test::lifetime_counter;
  const int before = lifetime_counter::live();
  {
    sluice::testing::virtual_loop loop;
    asio::co_spawn(
        loop.get_executor(),
        []() -> asio::awaitable<void> {
          lifetime_counter in_parent;
          co_await sluice::task_group::run([](sluice::task_group& g) -> asio::awaitable<void> {
            g.spawn(sluice::sleep(std::chrono::hours(1)));
            co_return;
          });
        },
        asio::detached);
    loop.run_for(std::chrono::seconds(1));
    CHECK(lifetime_counter::live() == before + 1);
  }
  CHECK(lifetime_counter::live() == before);
}
