// SPDX-License-Identifier: BSL-1.0
// sluice::with_timeout and the settling fan-outs under sluice::deadline
// (DESIGN.md "Beyond asyncio", semantics 4). Exact, in virtual time.
#include <sluice/timeout.hpp>

#include <sluice/gather.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/ending.hpp>
#include <support/lazy_tasks.hpp>
#include <support/spawned.hpp>
#include <support/virtual_timers.hpp>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::slow_service;
using sluice::testing::virtual_loop;
using sluice_test::pending_timers;
using sluice_test::tasks_on_loop;
namespace latency = sluice::testing::latency;

namespace {

asio::awaitable<int> value_after(std::chrono::nanoseconds d, int v) {
  co_await sluice::sleep(d);
  co_return v;
}

asio::awaitable<int> call_returning(slow_service& svc, int v) {
  co_await svc.call();
  co_return v;
}

bool is_timeout(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const sluice::timeout_error&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

TEST_CASE("an operation that finishes first returns its value and leaves no timer", "[timeout]") {
  virtual_loop loop;
  std::size_t timers_after = 99;
  const int v = loop.run([&]() -> asio::awaitable<int> {
    const int r = co_await sluice::with_timeout(5s, value_after(1s, 42));
    timers_after = pending_timers(loop);
    co_return r;
  });
  CHECK(v == 42);
  CHECK(loop.now() == 1s);
  CHECK(timers_after == 0);  // cancelled the moment the operation finished
}

TEST_CASE("with_timeout of a void operation", "[timeout]") {
  virtual_loop loop;
  loop.run(sluice::with_timeout(5s, sluice::sleep(2s)));
  CHECK(loop.now() == 2s);
  CHECK_THROWS_AS(loop.run(sluice::with_timeout(1s, sluice::sleep(2s))), sluice::timeout_error);
  CHECK(loop.now() == 3s);
}

TEST_CASE("an overrun cancels the operation, waits for it, then throws timeout_error",
          "[timeout]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(10s)});
  bool cleaned_up = false;
  auto op = [&]() -> asio::awaitable<void> {
    std::exception_ptr e;
    try {
      co_await svc.call();
    } catch (const sluice::system_error&) {
      e = std::current_exception();
    }
    // Cleanup that takes one more second and ignores cancellation.
    co_await asio::this_coro::throw_if_cancelled(false);
    co_await asio::this_coro::reset_cancellation_state();
    co_await sluice::sleep(1s);
    cleaned_up = true;
    if (e) std::rethrow_exception(e);
  };
  std::chrono::nanoseconds thrown_at{-1};
  std::size_t in_flight_at_throw = 99;
  std::chrono::nanoseconds limit{};
  loop.run([&]() -> asio::awaitable<void> {
    try {
      co_await sluice::with_timeout(2s, op());
    } catch (const sluice::timeout_error& e) {
      thrown_at = loop.now();
      in_flight_at_throw = svc.in_flight();
      limit = e.limit();
    }
  });
  CHECK(thrown_at == 3s);  // deadline 2 s + 1 s of cleanup
  CHECK(cleaned_up);
  CHECK(in_flight_at_throw == 0);
  CHECK(svc.cancellations() == 1);
  CHECK(limit == 2s);
}

TEST_CASE("timeout_error is not a system_error, so abort handlers do not swallow it", "[timeout]") {
  STATIC_REQUIRE(std::is_base_of_v<std::runtime_error, sluice::timeout_error>);
  STATIC_REQUIRE_FALSE(std::is_base_of_v<sluice::system_error, sluice::timeout_error>);
  CHECK(std::string(sluice::timeout_error(2s).what()).find("2.000 s") != std::string::npos);
}

TEST_CASE("an outer cancellation stays operation_aborted", "[timeout]") {
  tasks_on_loop h;
  slow_service svc({.latency = latency::fixed(20s)});
  auto& t =
      h.spawn([&]() -> asio::awaitable<void> { co_await sluice::with_timeout(10s, svc.call()); });
  h.loop.run_for(3s);
  t.cancel();
  h.poll();
  CHECK(t.cancelled());  // not timeout_error
  CHECK(svc.in_flight() == 0);
  CHECK(pending_timers(h.loop) == 0);
}

TEST_CASE("a caller cancelled before it called does not start the operation", "[timeout]") {
  tasks_on_loop h;
  slow_service svc;
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      co_await sluice::sleep(1s);
    } catch (const sluice::system_error&) {
    }
    co_await sluice::with_timeout(10s, svc.call());
  });
  h.poll();
  t.cancel();
  h.loop.run_for(1s);
  CHECK(t.cancelled());
  CHECK(svc.calls() == 0);
}

TEST_CASE("other exceptions pass through unchanged", "[timeout]") {
  virtual_loop loop;
  auto failing = []() -> asio::awaitable<int> {
    co_await sluice::sleep(1s);
    throw std::out_of_range("no such item");
  };
  CHECK_THROWS_AS(loop.run(sluice::with_timeout(5s, failing())), std::out_of_range);
  CHECK(loop.now() == 1s);
}

TEST_CASE("a value produced despite the cancellation is kept", "[timeout]") {
  virtual_loop loop;
  auto stubborn = []() -> asio::awaitable<int> {
    bool cancelled = false;
    try {
      co_await sluice::sleep(10s);
    } catch (const sluice::system_error&) {
      cancelled = true;
    }
    co_return cancelled ? 7 : 1;  // answers from a cache when cancelled
  };
  CHECK(loop.run(sluice::with_timeout(2s, stubborn())) == 7);
  CHECK(loop.now() == 2s);
}

TEST_CASE("an operation that ignores the cancellation keeps the value it returns late",
          "[timeout]") {
  virtual_loop loop;
  auto deaf = []() -> asio::awaitable<int> {
    co_await asio::this_coro::reset_cancellation_state(
        [](asio::cancellation_type) { return asio::cancellation_type::none; });
    co_await sluice::sleep(5s);
    co_return 9;
  };
  CHECK(loop.run(sluice::with_timeout(2s, deaf())) == 9);  // no timeout_error
  CHECK(loop.now() == 5s);
}

TEST_CASE(
    "an operation's own operation_aborted before the deadline passes through, not as a timeout",
    "[timeout]") {
  // An inner operation cancelled by something else (a closed socket, a
  // cancelled inner wait) ends `op` with operation_aborted at 1 s.
  virtual_loop loop;
  auto aborted_inside = []() -> asio::awaitable<int> {
    co_await sluice::sleep(1s);
    throw sluice::system_error(asio::error::operation_aborted, "socket closed");
  };
  std::string how;
  std::chrono::nanoseconds at{-1};
  loop.run([&]() -> asio::awaitable<void> {
    how = co_await sluice_test::ending_of(sluice::with_timeout(5s, aborted_inside()));
    at = loop.now();
  });
  CHECK(how == "aborted");  // the operation's own system_error, not timeout_error
  CHECK(at == 1s);
}

TEST_CASE("nested timeouts each report only their own deadline", "[timeout]") {
  virtual_loop loop;
  auto ending = [&](auto a) {
    return loop.run(sluice_test::ending_of(std::move(a)));
  };
  std::chrono::nanoseconds inner_limit{}, outer_limit{};
  loop.run([&]() -> asio::awaitable<void> {
    try {  // the inner one fires first: its own error passes through the outer
      co_await sluice::with_timeout(3s, sluice::with_timeout(1s, sluice::sleep(5s)));
    } catch (const sluice::timeout_error& e) {
      inner_limit = e.limit();
    }
    try {  // the outer one fires first: the inner one is cancelled, the outer reports
      co_await sluice::with_timeout(1s, sluice::with_timeout(3s, sluice::sleep(5s)));
    } catch (const sluice::timeout_error& e) {
      outer_limit = e.limit();
    }
  });
  CHECK(inner_limit == 1s);
  CHECK(outer_limit == 1s);
  CHECK(loop.now() == 2s);
  CHECK(ending(sluice::with_timeout(3s, sluice::with_timeout(1s, sluice::sleep(2s)))) ==
        sluice::timeout_error(1s).what());
}

TEST_CASE("an operation that finishes at the deadline instant keeps its value", "[timeout]") {
  virtual_loop loop;
  CHECK(loop.run(sluice::with_timeout(2s, value_after(2s, 5))) == 5);
}

// ---- deadline: settling fan-outs that keep what finished ----------------------

TEST_CASE("gather under a deadline keeps finished values and times out the rest", "[timeout]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::sequence({1s, 2s, 4s, 5s, 6s}),
                    .failure = sluice::testing::failures::at_calls({1})});
  std::size_t in_flight_after = 99;
  auto r = loop.run([&]() -> asio::awaitable<std::vector<sluice::outcome<int>>> {
    std::vector<asio::awaitable<int>> calls;
    for (int i = 0; i < 5; ++i) calls.push_back(call_returning(svc, i * 10));
    auto out =
        co_await sluice::gather(std::move(calls), sluice::return_exceptions, sluice::deadline(3s));
    in_flight_after = svc.in_flight();
    co_return out;
  });
  REQUIRE(r.size() == 5);
  CHECK(loop.now() == 3s);
  CHECK(r[0].value() == 0);
  CHECK_THROWS_AS(r[1].value(), sluice::testing::service_error);  // failed before: kept
  for (int i = 2; i < 5; ++i) CHECK(is_timeout(r[i].error()));
  CHECK(in_flight_after == 0);  // nothing running after the call returned
  CHECK(svc.cancellations() == 3);
  CHECK(pending_timers(loop) == 0);
}

TEST_CASE("gather_with_concurrency under a deadline never starts the inputs left over",
          "[timeout]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(2s)});
  sluice_test::lazy_tasks<asio::awaitable<int>> input(
      6, [&](std::size_t i) { return call_returning(svc, static_cast<int>(i)); });
  auto r = loop.run(
      sluice::gather_with_concurrency(2, input, sluice::return_exceptions, sluice::deadline(3s)));
  REQUIRE(r.size() == 6);
  CHECK(r[0].value() == 0);
  CHECK(r[1].value() == 1);
  for (int i = 2; i < 6; ++i) CHECK(is_timeout(r[i].error()));
  CHECK(svc.calls() == 4);  // 0 and 1 finished at 2 s; 2 and 3 were cut at 3 s
  CHECK(svc.cancellations() == 2);
  CHECK(svc.in_flight() == 0);
  CHECK(input.pulled() == 6);  // every input has its slot
  CHECK(loop.now() == 3s);
}

TEST_CASE("a fan-out that beats its deadline returns at once with every value", "[timeout]") {
  virtual_loop loop;
  std::vector<asio::awaitable<int>> tasks;
  for (int i = 0; i < 4; ++i) tasks.push_back(value_after(std::chrono::seconds(i), i));
  auto r = loop.run(sluice::gather_with_concurrency(2, std::move(tasks), sluice::return_exceptions,
                                                    sluice::deadline(1min)));
  REQUIRE(r.size() == 4);
  for (int i = 0; i < 4; ++i) CHECK(r[i].value() == i);
  CHECK(loop.now() == 4s);
  CHECK(pending_timers(loop) == 0);
}

TEST_CASE("a deadline gather of void tasks", "[timeout]") {
  virtual_loop loop;
  std::vector<asio::awaitable<void>> tasks;
  tasks.push_back(sluice::sleep(1s));
  tasks.push_back(sluice::sleep(5s));
  auto r =
      loop.run(sluice::gather(std::move(tasks), sluice::return_exceptions, sluice::deadline(2s)));
  REQUIRE(r.size() == 2);
  CHECK(r[0].has_value());
  CHECK(is_timeout(r[1].error()));
}

TEST_CASE("cancelling the caller of a deadline gather stays operation_aborted", "[timeout]") {
  tasks_on_loop h;
  slow_service svc({.latency = latency::fixed(10s)});
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<int>> calls;
    for (int i = 0; i < 3; ++i) calls.push_back(call_returning(svc, i));
    (void)co_await sluice::gather(std::move(calls), sluice::return_exceptions,
                                  sluice::deadline(5s));
  });
  h.loop.run_for(1s);
  t.cancel();
  h.poll();
  CHECK(t.cancelled());
  CHECK(svc.in_flight() == 0);
  CHECK(pending_timers(h.loop) == 0);
}

TEST_CASE("a deadline gather checks its limit before anything starts", "[timeout]") {
  slow_service svc;
  std::vector<asio::awaitable<int>> calls;
  calls.push_back(call_returning(svc, 1));
  CHECK_THROWS_AS((void)sluice::gather_with_concurrency(
                      0, std::move(calls), sluice::return_exceptions, sluice::deadline(1s)),
                  std::invalid_argument);
  CHECK(svc.calls() == 0);
}

TEST_CASE("an operation that cancels the caller while with_timeout starts it is cancelled at once",
          "[timeout]") {
  // `op` runs inline when with_timeout starts it and there requests the
  // caller's cancellation, before any handler of with_timeout's wait exists.
  for (bool throwing : {true, false}) {
    virtual_loop loop;
    slow_service svc({.latency = latency::fixed(1h)});
    asio::cancellation_signal cancel;
    std::string how;
    std::chrono::nanoseconds returned_at{-1};
    std::size_t in_flight_at_return = 99;
    auto cancels_its_caller = [&]() -> asio::awaitable<int> {
      cancel.emit(asio::cancellation_type::terminal);
      co_return co_await call_returning(svc, 1);
    };
    asio::co_spawn(
        loop.get_executor(),
        [&]() -> asio::awaitable<std::string> {
          co_await asio::this_coro::throw_if_cancelled(throwing);
          co_return co_await sluice_test::ending_of(sluice::with_timeout(2h, cancels_its_caller()));
        },
        sluice_test::bind_slot(cancel.slot(), [&](std::exception_ptr e, std::string s) {
          how = e ? sluice_test::ending_of_exception(e) : s;
          returned_at = loop.now();
          in_flight_at_return = svc.in_flight();
        }));
    loop.run_for(3h);
    CHECK(how == "aborted");  // not timeout_error, not the value
    CHECK(returned_at == 0s);
    CHECK(in_flight_at_return == 0);
    CHECK(svc.cancellations() == 1);
  }
}

TEST_CASE("with_timeout takes any duration and saturates it instead of overflowing", "[timeout]") {
  virtual_loop loop;
  // A thousand years in nanoseconds overflows: before sluice saw it, the
  // deadline was in the past and the call timed out at once.
  loop.run(sluice::with_timeout(std::chrono::hours(24 * 365 * 1000), sluice::sleep(1s)));
  CHECK(loop.now() == 1s);
  loop.run(sluice::with_timeout(std::chrono::hours::max(), sluice::sleep(1h)));
  CHECK(loop.now() == 1h + 1s);
  CHECK_THROWS_AS(
      loop.run(sluice::with_timeout(std::chrono::duration<double>(0.5), sluice::sleep(1s))),
      sluice::timeout_error);
  CHECK(loop.now() == 1h + 1500ms);
  // A deadline of the clock's range never fires: only the operation ends the wait.
  CHECK_THROWS_AS(loop.run(sluice::with_timeout(std::chrono::hours::max(),
                                                sluice::sleep(sluice::clock::duration::max()))),
                  sluice::testing::deadlock_error);
}
