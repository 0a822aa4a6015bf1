// SPDX-License-Identifier: BSL-1.0
// single_flight: DESIGN.md "Beyond asyncio", semantics 2 (Go's
// x/sync/singleflight is the anchor), and pynenc's dedupe scenario.
#include <sluice/single_flight.hpp>

#include <sluice/gather.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/ending.hpp>
#include <support/spawned.hpp>

#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::slow_service;
using sluice::testing::virtual_loop;
using sluice::testing::latency::fixed;
using sluice_test::tasks_on_loop;

namespace {

// The shared work: one provider call for the account, then its result.
asio::awaitable<std::string> refresh(slow_service& svc, std::string account) {
  co_await svc.call(account, "refresh");
  co_return "refreshed " + account;
}

// A work that, when cancelled, needs `cleanup` of its own before it ends.
struct slow_cleanup {
  bool cancelled = false, finished = false;
  asio::awaitable<int> run(slow_service& svc, std::chrono::nanoseconds cleanup) {
    std::exception_ptr e;
    try {
      co_await svc.call("k");
    } catch (...) {
      e = std::current_exception();
    }
    if (e) {
      cancelled = true;
      co_await asio::this_coro::reset_cancellation_state();
      co_await sluice::sleep(cleanup);
      finished = true;
      std::rethrow_exception(e);
    }
    finished = true;
    co_return 42;
  }
};

}  // namespace

TEST_CASE("twelve callers over three accounts share three executions and all get results",
          "[single_flight]") {
  slow_service svc({.latency = fixed(400ms)});
  sluice::single_flight<std::string, std::string> refreshes;
  std::size_t joinable_at_start = 0;
  auto caller = [&](std::string account) -> asio::awaitable<std::string> {
    // Named: g++ 12 miscompiles a closure that owns a std::string when it is
    // a temporary argument of a coroutine inside a co_await expression.
    auto fn = [&svc, account] {
      return refresh(svc, account);
    };
    co_return co_await refreshes.run(account, fn);
  };
  virtual_loop loop;
  auto results = loop.run([&]() -> asio::awaitable<std::vector<std::string>> {
    std::vector<asio::awaitable<std::string>> v;
    for (int i = 0; i < 4; ++i)
      for (const char* a : {"acme", "globex", "initech"}) v.push_back(caller(a));
    auto probe = [&]() -> asio::awaitable<void> {
      co_await sluice::sleep(100ms);
      joinable_at_start = refreshes.in_flight();
    };
    asio::co_spawn(co_await asio::this_coro::executor, probe(), asio::detached);
    co_return co_await sluice::gather(std::move(v));
  });
  CHECK(svc.calls() == 3);
  CHECK(svc.collisions() == 0);
  REQUIRE(results.size() == 12);
  for (std::size_t i = 0; i < 12; ++i) {
    const char* expected[] = {"refreshed acme", "refreshed globex", "refreshed initech"};
    CHECK(results[i] == expected[i % 3]);
  }
  CHECK(joinable_at_start == 3);
  CHECK(refreshes.in_flight() == 0);
  CHECK(loop.now() == 400ms);
}

TEST_CASE("a failing shared call throws its exception to every joined caller", "[single_flight]") {
  slow_service svc(
      {.latency = fixed(1s), .failure = sluice::testing::failures::for_keys({"acme"})});
  sluice::single_flight<std::string, std::string> refreshes;
  virtual_loop loop;
  auto endings = loop.run([&]() -> asio::awaitable<std::vector<std::string>> {
    auto fn = [&svc] {
      return refresh(svc, "acme");
    };
    std::vector<asio::awaitable<std::string>> v;
    for (int i = 0; i < 3; ++i) v.push_back(sluice_test::ending_of(refreshes.run("acme", fn)));
    co_return co_await sluice::gather(std::move(v));
  });
  CHECK(svc.calls() == 1);
  CHECK(endings == std::vector<std::string>(3, "slow_service: call #0 (key acme) failed"));
  CHECK(refreshes.in_flight() == 0);
}

TEST_CASE("cancelling one of three callers leaves the others' result intact and the work running",
          "[single_flight]") {
  for (std::size_t cancelled : {0u, 1u, 2u}) {  // the starter, a joiner, the last joiner
    CAPTURE(cancelled);
    slow_service svc({.latency = fixed(10s)});
    sluice::single_flight<std::string, std::string> refreshes;
    tasks_on_loop h;
    std::vector<std::string> got(3);
    std::vector<sluice_test::task*> t;
    for (std::size_t i = 0; i < 3; ++i) {
      t.push_back(&h.spawn([&, i]() -> asio::awaitable<void> {
        got[i] = co_await refreshes.run("acme", [&svc] { return refresh(svc, "acme"); });
      }));
    }
    h.poll();
    CHECK(svc.calls() == 1);
    h.loop.run_for(3s);
    t[cancelled]->cancel();
    h.poll();
    CHECK(t[cancelled]->cancelled());
    CHECK(svc.in_flight() == 1);  // the work goes on
    CHECK(svc.cancellations() == 0);
    CHECK(refreshes.in_flight() == 1);
    h.loop.run_for(7s);
    for (std::size_t i = 0; i < 3; ++i) {
      if (i == cancelled) continue;
      CHECK(t[i]->succeeded());
      CHECK(got[i] == "refreshed acme");
    }
    CHECK(got[cancelled].empty());
    CHECK(svc.completed() == 1);
    CHECK(refreshes.in_flight() == 0);
  }
}

TEST_CASE("cancelling all three callers cancels the work, which has finished when the last returns",
          "[single_flight]") {
  slow_service svc({.latency = fixed(10s)});
  sluice::single_flight<std::string, int> flights;
  slow_cleanup work;
  tasks_on_loop h;
  std::vector<bool> finished_when_returned;
  std::vector<std::chrono::nanoseconds> returned_at;
  std::vector<sluice_test::task*> t;
  for (int i = 0; i < 3; ++i) {
    t.push_back(&h.spawn([&]() -> asio::awaitable<void> {
      std::exception_ptr e;
      try {
        co_await flights.run("k", [&] { return work.run(svc, 500ms); });
      } catch (...) {
        e = std::current_exception();
      }
      finished_when_returned.push_back(work.finished);
      returned_at.push_back(h.loop.now());
      if (e) std::rethrow_exception(e);
    }));
  }
  h.poll();
  h.loop.run_for(1s);
  t[1]->cancel();
  t[0]->cancel();
  h.poll();
  CHECK_FALSE(work.cancelled);  // two left, one still waits
  t[2]->cancel();
  h.poll();
  CHECK(work.cancelled);
  CHECK_FALSE(t[2]->done);  // the last caller waits for the work's cleanup
  CHECK(flights.in_flight() == 0);
  h.loop.run_for(1s);
  for (auto* x : t) CHECK(x->cancelled());
  CHECK(finished_when_returned == std::vector<bool>{false, false, true});
  CHECK(returned_at == std::vector<std::chrono::nanoseconds>{1s, 1s, 1500ms});
  CHECK(svc.cancellations() == 1);
  CHECK(svc.in_flight() == 0);
}

TEST_CASE("callers racing timeouts leave one by one; the last timeout cancels and awaits the work",
          "[single_flight]") {
  using namespace asio::experimental::awaitable_operators;
  slow_service svc({.latency = fixed(5s)});
  sluice::single_flight<std::string, int> flights;
  slow_cleanup work;
  std::vector<std::chrono::nanoseconds> returned_at;
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    auto fn = [&] {
      return work.run(svc, 500ms);
    };
    auto caller = [&](std::chrono::nanoseconds timeout) -> asio::awaitable<void> {
      auto r = co_await (flights.run("k", fn) || sluice::sleep(timeout));
      CHECK(r.index() == 1);  // timed out
      returned_at.push_back(loop.now());
    };
    co_await (caller(1s) && caller(2s));
  });
  CHECK(returned_at == std::vector<std::chrono::nanoseconds>{1s, 2500ms});
  CHECK(work.cancelled);
  CHECK(work.finished);
  CHECK(svc.cancellations() == 1);
  CHECK(flights.in_flight() == 0);
}

TEST_CASE("the last caller cancelled again while the work winds down still waits for it",
          "[single_flight]") {
  slow_service svc({.latency = fixed(10s)});
  sluice::single_flight<std::string, int> flights;
  slow_cleanup work;
  tasks_on_loop h;
  bool finished_when_returned = false;
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    std::exception_ptr e;
    try {
      co_await flights.run("k", [&] { return work.run(svc, 2s); });
    } catch (...) {
      e = std::current_exception();
    }
    finished_when_returned = work.finished;
    if (e) std::rethrow_exception(e);
  });
  h.poll();
  t.cancel();
  h.loop.run_for(1s);
  t.cancel();
  t.cancel();
  h.poll();
  CHECK_FALSE(t.done);
  h.loop.run_for(1s);
  CHECK(t.cancelled());
  CHECK(finished_when_returned);
  CHECK(h.loop.now() == 2s);
}

TEST_CASE("a caller cancelled before it called starts nothing and joins nothing",
          "[single_flight]") {
  slow_service svc({.latency = fixed(1s)});
  sluice::single_flight<std::string, std::string> refreshes;
  tasks_on_loop h;
  auto fn = [&svc] {
    return refresh(svc, "acme");
  };
  auto late_caller = [&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      co_await sluice::sleep(1h);  // cancelled here...
    } catch (const sluice::system_error&) {
    }
    co_await asio::this_coro::throw_if_cancelled(true);
    (void)co_await refreshes.run("acme", fn);  // ...then calls
  };
  // Nobody running: it starts nothing.
  auto& alone = h.spawn(late_caller);
  h.poll();
  alone.cancel();
  h.poll();
  CHECK(alone.cancelled());
  CHECK(svc.calls() == 0);
  CHECK(refreshes.in_flight() == 0);
  // An execution running: it joins nothing and the execution is untouched.
  std::string got;
  auto& caller =
      h.spawn([&]() -> asio::awaitable<void> { got = co_await refreshes.run("acme", fn); });
  auto& late = h.spawn(late_caller);
  h.poll();
  late.cancel();
  h.poll();
  CHECK(late.cancelled());
  h.loop.run_for(1s);
  CHECK(caller.succeeded());
  CHECK(got == "refreshed acme");
  CHECK(svc.calls() == 1);
  CHECK(svc.cancellations() == 0);
}

TEST_CASE("a caller cancelled in the instant the work ends loses nothing for the others",
          "[single_flight]") {
  slow_service svc({.latency = fixed(1s)});
  sluice::single_flight<std::string, std::string> refreshes;
  tasks_on_loop h;
  std::vector<std::string> endings(3);
  std::vector<sluice_test::task*> t;
  // The canceller's timer is set first, so it fires first at 1 s.
  h.spawn([&]() -> asio::awaitable<void> {
    co_await sluice::sleep(1s);
    t[1]->cancel();
  });
  for (std::size_t i = 0; i < 3; ++i) {
    t.push_back(&h.spawn([&, i]() -> asio::awaitable<void> {
      endings[i] = co_await sluice_test::ending_of(
          refreshes.run("acme", [&svc] { return refresh(svc, "acme"); }));
    }));
  }
  h.loop.run_for(2s);
  CHECK(endings == std::vector<std::string>{"ok", "aborted", "ok"});
  CHECK(svc.completed() == 1);
  CHECK(svc.cancellations() == 0);
}

TEST_CASE("after every caller left, a new caller starts a new execution", "[single_flight]") {
  slow_service svc({.latency = fixed(10s)});
  sluice::single_flight<std::string, int> flights;
  slow_cleanup first, second;
  tasks_on_loop h;
  auto& a = h.spawn([&]() -> asio::awaitable<void> {
    (void)co_await flights.run("k", [&] { return first.run(svc, 3s); });
  });
  h.poll();
  a.cancel();
  h.poll();
  CHECK(first.cancelled);  // winding down for 3 s
  int got = 0;
  auto& b = h.spawn([&]() -> asio::awaitable<void> {
    got = co_await flights.run("k", [&] { return second.run(svc, 3s); });
  });
  h.poll();
  CHECK(svc.calls() == 2);
  CHECK(flights.in_flight() == 1);
  h.loop.run_for(10s);
  CHECK(a.cancelled());
  CHECK(b.succeeded());
  CHECK(got == 42);
  CHECK(flights.in_flight() == 0);
}

TEST_CASE("a call after the execution ended starts a new one: nothing is cached",
          "[single_flight]") {
  slow_service svc({.latency = fixed(1s)});
  sluice::single_flight<std::string, std::string> refreshes;
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    auto fn = [&svc] {
      return refresh(svc, "acme");
    };
    // Not inside CHECK: g++ 12 evaluates a co_await in Catch's short-circuited
    // re-check of the expression as well.
    auto first = co_await refreshes.run("acme", fn);
    auto second = co_await refreshes.run("acme", fn);
    CHECK(first == "refreshed acme");
    CHECK(second == "refreshed acme");
  });
  CHECK(svc.calls() == 2);
  CHECK(loop.now() == 2s);
}

TEST_CASE("keys are independent: each runs its own execution at once", "[single_flight]") {
  slow_service svc({.latency = fixed(1s)});
  sluice::single_flight<std::string, std::string> refreshes;
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto get = [&](std::string a) {
      return refreshes.run(a, [&svc, a] { return refresh(svc, a); });
    };
    auto [x, y] = co_await (get("a") && get("b"));
    CHECK(x == "refreshed a");
    CHECK(y == "refreshed b");
  });
  CHECK(svc.calls() == 2);
  CHECK(svc.max_in_flight() == 2);
  CHECK(loop.now() == 1s);
}

TEST_CASE("each caller gets its own copy of the result", "[single_flight]") {
  sluice::single_flight<int, std::vector<int>> flights;
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto fn = []() -> asio::awaitable<std::vector<int>> {
      co_await sluice::sleep(1s);
      co_return std::vector<int>{1, 2, 3};
    };
    auto mutate = [&]() -> asio::awaitable<std::vector<int>> {
      auto v = co_await flights.run(7, fn);
      v.push_back(4);
      co_return v;
    };
    auto [x, y] = co_await (mutate() && flights.run(7, fn));
    CHECK(x == std::vector<int>{1, 2, 3, 4});
    CHECK(y == std::vector<int>{1, 2, 3});
  });
  CHECK(loop.now() == 1s);
}

TEST_CASE("void results and results that are not default constructible work", "[single_flight]") {
  struct token {
    explicit token(int v) : value(v) {}
    int value;
  };
  sluice::single_flight<int, void> voids;
  sluice::single_flight<int, token> tokens;
  int runs = 0;
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto v = [&]() -> asio::awaitable<void> {
      ++runs;
      co_await sluice::sleep(1s);
    };
    co_await (voids.run(1, v) && voids.run(1, v));
    auto t = []() -> asio::awaitable<token> {
      co_await sluice::sleep(1s);
      co_return token{5};
    };
    auto [a, b] = co_await (tokens.run(1, t) && tokens.run(1, t));
    CHECK(a.value == 5);
    CHECK(b.value == 5);
  });
  CHECK(runs == 1);
  CHECK(loop.now() == 2s);
}

TEST_CASE("fn throwing when called reaches its caller and registers nothing", "[single_flight]") {
  sluice::single_flight<int, int> flights;
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    auto bad = []() -> asio::awaitable<int> {
      throw std::runtime_error("no connection");
    };
    auto how = co_await sluice_test::ending_of(flights.run(1, bad));
    CHECK(how == "no connection");
    CHECK(flights.in_flight() == 0);
    auto good = []() -> asio::awaitable<int> {
      co_return 3;
    };
    auto r = co_await flights.run(1, good);
    CHECK(r == 3);
  });
}

TEST_CASE("callers on a strand resume on it and the work runs on the first caller's strand",
          "[single_flight]") {
  virtual_loop loop;
  auto strand = asio::make_strand(loop.get_executor());
  sluice::single_flight<int, int> flights;
  int work_on_strand = 0, resumed_on_strand = 0, runs = 0;
  auto work = [&]() -> asio::awaitable<int> {
    ++runs;
    co_await sluice::sleep(1s);
    work_on_strand += strand.running_in_this_thread() ? 1 : 0;
    co_return 7;
  };
  for (int i = 0; i < 3; ++i) {
    asio::co_spawn(
        strand,
        [&]() -> asio::awaitable<void> {
          const int r = co_await flights.run(1, work);
          resumed_on_strand += (r == 7 && strand.running_in_this_thread()) ? 1 : 0;
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
  }
  loop.run_for(2s);
  CHECK(runs == 1);
  CHECK(work_on_strand == 1);
  CHECK(resumed_on_strand == 3);
}

TEST_CASE(
    "a first caller whose work cancels it while starting leaves at once and the work is "
    "cancelled",
    "[single_flight]") {
  // The work runs inline when the first caller starts it and there requests
  // that caller's cancellation, before the caller waits on the flight.
  for (bool throwing : {true, false}) {
    slow_service svc({.latency = fixed(1h)});
    sluice::single_flight<std::string, std::string> refreshes;
    virtual_loop loop;
    asio::cancellation_signal cancel;
    std::string how;
    std::chrono::nanoseconds returned_at{-1};
    std::size_t in_flight_at_return = 99;
    auto fn = [&]() -> asio::awaitable<std::string> {
      cancel.emit(asio::cancellation_type::terminal);
      co_return co_await refresh(svc, "acme");
    };
    asio::co_spawn(
        loop.get_executor(),
        [&]() -> asio::awaitable<std::string> {
          co_await asio::this_coro::throw_if_cancelled(throwing);
          co_return co_await sluice_test::ending_of(refreshes.run("acme", fn));
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
    CHECK(svc.cancellations() == 1);
    CHECK(refreshes.in_flight() == 0);
  }
}

TEST_CASE(
    "the work of a capturing coroutine lambda outlives its first caller's cancellation intact",
    "[single_flight]") {
  // fn's coroutine frame refers to fn's closure (its captures); the work runs
  // on after the caller that called fn() left, so the flight must keep fn.
  slow_service svc({.latency = fixed(10s)});
  sluice::single_flight<std::string, std::string> refreshes;
  tasks_on_loop h;
  const std::string account(40, 'a');  // long enough to live on the heap
  std::vector<std::string> got(2);
  std::vector<sluice_test::task*> t;
  for (std::size_t i = 0; i < 2; ++i) {
    t.push_back(&h.spawn([&, i]() -> asio::awaitable<void> {
      auto fn = [&svc, id = account]() -> asio::awaitable<std::string> {
        co_await svc.call(id, "refresh");
        co_return "refreshed " + id;  // reads the capture after the first caller left
      };
      got[i] = co_await refreshes.run(account, fn);
    }));
  }
  h.poll();
  h.loop.run_for(3s);
  t[0]->cancel();  // the caller that called fn() leaves; its closure is gone
  h.poll();
  CHECK(t[0]->cancelled());
  h.loop.run_for(7s);
  CHECK(t[1]->succeeded());
  CHECK(got[1] == "refreshed " + account);
  CHECK(svc.calls() == 1);
}
