// SPDX-License-Identifier: BSL-1.0
#include <sluice/gather.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/ending.hpp>
#include <support/lazy_tasks.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>
#include <queue>
#include <string>
#include <system_error>
#include <variant>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::slow_service;
using sluice::testing::virtual_loop;
namespace latency = sluice::testing::latency;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace {

// A task that sleeps `d` and returns `v`, recording nothing else.
asio::awaitable<int> after(nanoseconds d, int v) {
  co_await sluice::sleep(d);
  co_return v;
}

asio::awaitable<int> fail_after(nanoseconds d, std::string what) {
  co_await sluice::sleep(d);
  throw std::runtime_error(what);
}

asio::awaitable<int> call_returning(slow_service& svc, int v, std::string key = {}) {
  co_await svc.call(std::move(key));
  co_return v;
}

std::vector<asio::awaitable<int>> calls(slow_service& svc, std::size_t n) {
  std::vector<asio::awaitable<int>> v;
  for (std::size_t i = 0; i < n; ++i) v.push_back(call_returning(svc, static_cast<int>(i)));
  return v;
}

// The makespan of greedy list scheduling on `workers` machines: each job, in
// order, starts on the machine that frees first. Independent of sluice.
nanoseconds greedy_makespan(const std::vector<nanoseconds>& jobs, std::size_t workers) {
  std::priority_queue<nanoseconds, std::vector<nanoseconds>, std::greater<>> free_at;
  for (std::size_t i = 0; i < workers; ++i) free_at.push(0ns);
  nanoseconds end{0};
  for (auto j : jobs) {
    auto t = free_at.top();
    free_at.pop();
    free_at.push(t + j);
    end = std::max(end, t + j);
  }
  return end;
}

}  // namespace

TEST_CASE("results come back in input order, not completion order", "[gather]") {
  virtual_loop loop;
  auto r = loop.run([]() -> asio::awaitable<std::vector<int>> {
    std::vector<asio::awaitable<int>> v;
    v.push_back(after(300ms, 0));
    v.push_back(after(100ms, 1));
    v.push_back(after(200ms, 2));
    co_return co_await sluice::gather(std::move(v));
  });
  CHECK(r == std::vector<int>{0, 1, 2});
  CHECK(loop.now() == 300ms);
}

TEST_CASE("nine category searches of 200 ms take 1.8 s one by one and 0.4 s bounded by 5",
          "[gather]") {
  slow_service places({.latency = latency::fixed(200ms)});
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    for (int i = 0; i < 9; ++i) co_await places.call("category-" + std::to_string(i));
  });
  CHECK(loop.now() == 1800ms);

  virtual_loop bounded;
  slow_service places2({.latency = latency::fixed(200ms)});
  auto r = bounded.run(sluice::gather_with_concurrency(5, calls(places2, 9)));
  CHECK(r.size() == 9);
  CHECK(bounded.now() == 400ms);
  CHECK(places2.max_in_flight() == 5);
}

TEST_CASE("fourteen calls of 1 to 5 s: sequential is the sum, bounded by 5 is the greedy makespan",
          "[gather]") {
  const auto model = latency::uniform(1s, 5s, 7);
  std::vector<nanoseconds> jobs;
  for (std::size_t i = 0; i < 14; ++i) jobs.push_back(model({i, "", ""}));
  const auto sum = std::accumulate(jobs.begin(), jobs.end(), nanoseconds{0});
  REQUIRE(sum >= 14s);

  virtual_loop seq;
  slow_service svc_seq({.latency = model});
  seq.run([&]() -> asio::awaitable<void> {
    for (int i = 0; i < 14; ++i) co_await svc_seq.call();
  });
  CHECK(seq.now() == sum);

  virtual_loop par;
  slow_service svc_par({.latency = model});
  par.run(sluice::gather_with_concurrency(5, calls(svc_par, 14)));
  CHECK(par.now() == greedy_makespan(jobs, 5));
  CHECK(par.now() < sum / 3);
}

TEST_CASE("limit 2 over 0.1 0.2 0.2 0.1 finishes at 0.3 s where batches would take 0.4 s",
          "[gather]") {
  slow_service svc({.latency = latency::sequence({100ms, 200ms, 200ms, 100ms})});
  virtual_loop loop;
  loop.run(sluice::gather_with_concurrency(2, calls(svc, 4)));
  CHECK(loop.now() == 300ms);
  // The third call starts the instant the first frees its slot (0.1 s), the
  // fourth when the second ends (0.2 s): no batches.
  REQUIRE(svc.timeline().size() == 4);
  CHECK(svc.timeline()[2].start == 100ms);
  CHECK(svc.timeline()[3].start == 200ms);
}

TEST_CASE("at most limit tasks run at once: max in flight is min(limit, n)", "[gather]") {
  for (std::size_t limit : {1u, 3u, 5u, 16u}) {
    for (std::size_t n : {1u, 4u, 10u}) {
      slow_service svc({.latency = latency::uniform(10ms, 90ms, limit * 31 + n)});
      virtual_loop loop;
      auto r = loop.run(sluice::gather_with_concurrency(limit, calls(svc, n)));
      CHECK(r.size() == n);
      CHECK(svc.max_in_flight() == std::min(limit, n));
      CHECK(svc.completed() == n);
    }
  }
}

TEST_CASE("unbounded gather runs every task at once", "[gather]") {
  slow_service svc({.latency = latency::fixed(1s)});
  virtual_loop loop;
  auto r = loop.run(sluice::gather(calls(svc, 50)));
  CHECK(r.size() == 50);
  CHECK(svc.max_in_flight() == 50);
  CHECK(loop.now() == 1s);
}

TEST_CASE("a lazy input is pulled only as slots free up", "[gather]") {
  slow_service svc({.latency = latency::fixed(1s)});
  virtual_loop loop;
  sluice_test::lazy_tasks<asio::awaitable<int>> input(
      20, [&](std::size_t i) { return call_returning(svc, static_cast<int>(i)); });
  std::size_t pulled_at_first_completion = 0;
  auto watch = [&]() -> asio::awaitable<void> {
    co_await sluice::sleep(999ms);
    pulled_at_first_completion = input.pulled();
  };
  loop.run([&]() -> asio::awaitable<void> {
    auto r = co_await sluice::gather(watch(), sluice::gather_with_concurrency(3, input));
    CHECK(std::get<1>(r).size() == 20);
  });
  CHECK(pulled_at_first_completion == 3);
  CHECK(input.pulled() == 20);
  CHECK(loop.now() == 7s);  // ceil(20 / 3) rounds of 1 s
}

TEST_CASE("an unsized lazy input works unbounded too", "[gather]") {
  slow_service svc({.latency = latency::fixed(1s)});
  virtual_loop loop;
  sluice_test::lazy_tasks<asio::awaitable<int>> input(
      7, [&](std::size_t i) { return call_returning(svc, static_cast<int>(i) * 2); });
  auto r = loop.run(sluice::gather(input));
  CHECK(r == std::vector<int>{0, 2, 4, 6, 8, 10, 12});
  CHECK(svc.max_in_flight() == 7);
  CHECK(loop.now() == 1s);
}

TEST_CASE("the first exception in time is rethrown after every sibling was cancelled and finished",
          "[gather]") {
  slow_service svc({.latency = latency::fixed(10s)});
  virtual_loop loop;
  std::size_t in_flight_after = 99;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<int>> v;
    v.push_back(fail_after(300ms, "second in time"));
    v.push_back(call_returning(svc, 1));
    v.push_back(fail_after(200ms, "first in time"));
    v.push_back(call_returning(svc, 2));
    try {
      co_await sluice::gather_with_concurrency(4, std::move(v));
      FAIL("gather did not throw");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "first in time");
    }
    in_flight_after = svc.in_flight();
  });
  CHECK(in_flight_after == 0);
  CHECK(svc.cancellations() == 2);
  CHECK(loop.now() == 200ms);
}

TEST_CASE("nothing is pulled from the input after a failure", "[gather]") {
  virtual_loop loop;
  sluice_test::lazy_tasks<asio::awaitable<int>> input(100, [](std::size_t i) {
    return i == 4 ? fail_after(150ms, "task 4") : after(100ms, static_cast<int>(i));
  });
  CHECK_THROWS_WITH(loop.run(sluice::gather_with_concurrency(2, input)), "task 4");
  // Tasks 0,1 end at 0.1 s; 2,3 at 0.2 s; 4 and 5 start at 0.2 s; 5 ends at
  // 0.3 s and 6 starts; 4 fails at 0.35 s and 6 is cancelled. 7 items were
  // pulled, none after the failure.
  CHECK(input.pulled() == 7);
  CHECK(loop.now() == 350ms);
}

TEST_CASE("an exception thrown by the input range is rethrown after running tasks were cancelled",
          "[gather]") {
  slow_service svc({.latency = latency::fixed(1s)});
  virtual_loop loop;
  sluice_test::lazy_tasks<asio::awaitable<int>> input(
      10, [&](std::size_t i) { return call_returning(svc, static_cast<int>(i)); });
  input.throw_at(3);
  CHECK_THROWS_AS(loop.run(sluice::gather_with_concurrency(2, input)), sluice_test::input_broken);
  CHECK(svc.in_flight() == 0);
  CHECK(input.pulled() == 3);
}

TEST_CASE("return_exceptions runs every task and keeps each value or exception in its slot",
          "[gather]") {
  slow_service svc(
      {.latency = latency::fixed(1s), .failure = sluice::testing::failures::at_calls({1, 3})});
  virtual_loop loop;
  auto r = loop.run(sluice::gather_with_concurrency(2, calls(svc, 5), sluice::return_exceptions));
  REQUIRE(r.size() == 5);
  CHECK(svc.completed() == 3);
  CHECK(svc.cancellations() == 0);
  CHECK(loop.now() == 3s);
  for (std::size_t i : {0u, 2u, 4u}) {
    REQUIRE(r[i].has_value());
    CHECK(*r[i] == static_cast<int>(i));
  }
  for (std::size_t i : {1u, 3u}) {
    REQUIRE_FALSE(r[i]);
    CHECK_THROWS_AS(r[i].value(), sluice::testing::service_error);
  }
}

namespace {

// A result with no default constructor: results are stored as optionals
// instead of straight into the returned vector; both must behave the same.
struct no_default {
  explicit no_default(int x) : v(x) {}
  int v;
};

template <class T>
asio::awaitable<T> value_after(slow_service& svc, int v) {
  co_await svc.call();
  co_return T(v);
}

template <class T>
asio::awaitable<T> failing_after(nanoseconds d, std::string what) {
  co_await sluice::sleep(d);
  throw std::runtime_error(what);
}

template <class T>
int value_of(const T& t) {
  if constexpr (std::is_same_v<T, int>) {
    return t;
  } else {
    return t.v;
  }
}

}  // namespace

TEMPLATE_TEST_CASE("unbounded gather fails fast: siblings cancelled, first error in time rethrown",
                   "[gather]", int, no_default) {
  slow_service svc({.latency = latency::fixed(10s)});
  virtual_loop loop;
  std::size_t in_flight_after = 99;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<TestType>> v;
    for (int i = 0; i < 20; ++i) v.push_back(value_after<TestType>(svc, i));
    v.push_back(failing_after<TestType>(300ms, "second in time"));
    v.push_back(failing_after<TestType>(200ms, "first in time"));
    try {
      co_await sluice::gather(std::move(v));
      FAIL("gather did not throw");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "first in time");
    }
    in_flight_after = svc.in_flight();
  });
  CHECK(in_flight_after == 0);
  CHECK(svc.max_in_flight() == 20);
  CHECK(svc.cancellations() == 20);
  CHECK(loop.now() == 200ms);
}

TEMPLATE_TEST_CASE("unbounded gather keeps input order and settles with return_exceptions",
                   "[gather]", int, no_default) {
  slow_service svc({.latency = latency::sequence({3s, 1s, 2s, 1s}),
                    .failure = sluice::testing::failures::at_calls({1})});
  virtual_loop loop;
  std::vector<asio::awaitable<TestType>> v;
  for (int i = 0; i < 4; ++i) v.push_back(value_after<TestType>(svc, i * 10));
  auto r = loop.run(sluice::gather(std::move(v), sluice::return_exceptions));
  REQUIRE(r.size() == 4);
  CHECK(loop.now() == 3s);
  CHECK(svc.max_in_flight() == 4);
  CHECK_THROWS_AS(r[1].value(), sluice::testing::service_error);
  for (int i : {0, 2, 3}) {
    REQUIRE(r[static_cast<std::size_t>(i)].has_value());
    CHECK(value_of(*r[static_cast<std::size_t>(i)]) == i * 10);
  }
}

TEST_CASE(
    "unbounded gather over a mix of immediate and slow tasks keeps order and runs all at once",
    "[gather]") {
  // A worker runs on through immediate tasks and stops at a slow one, which
  // it waits for: the next task gets a worker of its own, so every slow task
  // still starts at t = 0.
  slow_service svc({.latency = latency::fixed(1s)});
  virtual_loop loop;
  auto immediate = [](int v) -> asio::awaitable<int> {
    co_return v;
  };
  std::vector<asio::awaitable<int>> v;
  std::vector<int> expected;
  for (int i = 0; i < 30; ++i) {
    v.push_back(i % 7 < 3 ? immediate(i) : call_returning(svc, i));
    expected.push_back(i);
  }
  auto r = loop.run(sluice::gather(std::move(v)));
  CHECK(r == expected);
  CHECK(svc.max_in_flight() == 16);  // i % 7 in {3, 4, 5, 6} for i < 30
  CHECK(loop.now() == 1s);
}

TEST_CASE("return_exceptions over void tasks gives outcome<void> slots", "[gather]") {
  virtual_loop loop;
  auto r = loop.run([]() -> asio::awaitable<std::vector<sluice::outcome<void>>> {
    std::vector<asio::awaitable<void>> v;
    v.push_back(sluice::sleep(1s));
    v.push_back([]() -> asio::awaitable<void> {
      throw std::logic_error("x");
      co_return;  // makes the lambda a coroutine: it throws when awaited, not when called
    }());
    co_return co_await sluice::gather(std::move(v), sluice::return_exceptions);
  });
  REQUIRE(r.size() == 2);
  CHECK(r[0].has_value());
  CHECK_THROWS_AS(r[1].value(), std::logic_error);
}

TEST_CASE(
    "cancelling the caller cancels every child, waits for them and completes with "
    "operation_aborted",
    "[gather]") {
  slow_service svc({.latency = latency::fixed(10s)});
  virtual_loop loop;
  asio::cancellation_signal cancel;
  std::exception_ptr error;
  bool done = false;
  asio::co_spawn(
      loop.get_executor(), sluice::gather_with_concurrency(3, calls(svc, 6)),
      asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, std::vector<int>) {
        error = e;
        done = true;
      }));
  loop.run_for(1500ms);
  REQUIRE(svc.in_flight() == 3);
  cancel.emit(asio::cancellation_type::terminal);
  loop.run_for(0ms);
  REQUIRE(done);
  CHECK(svc.in_flight() == 0);
  CHECK(svc.cancellations() == 3);
  CHECK(svc.calls() == 3);
  REQUIRE(error);
  try {
    std::rethrow_exception(error);
  } catch (const sluice::system_error& e) {
    CHECK(e.code() == asio::error::operation_aborted);
  }
}

TEST_CASE("a timeout around gather stops it at the deadline with nothing left running",
          "[gather]") {
  using namespace asio::experimental::awaitable_operators;
  slow_service svc({.latency = latency::fixed(10s)});
  virtual_loop loop;
  auto r = loop.run([&]() -> asio::awaitable<std::variant<std::vector<int>, std::monostate>> {
    co_return co_await (sluice::gather_with_concurrency(4, calls(svc, 8)) || sluice::sleep(2s));
  });
  CHECK(r.index() == 1);
  CHECK(loop.now() == 2s);
  CHECK(svc.in_flight() == 0);
  CHECK(svc.cancellations() == 4);
}

TEST_CASE("a caller cancelled before the call starts nothing", "[gather]") {
  slow_service svc;
  virtual_loop loop;
  asio::cancellation_signal cancel;
  std::exception_ptr error;
  asio::co_spawn(
      loop.get_executor(),
      [&]() -> asio::awaitable<void> {
        co_await asio::this_coro::throw_if_cancelled(false);
        try {
          co_await sluice::sleep(1s);
        } catch (const sluice::system_error&) {
        }
        // throw_if_cancelled stays off: with it on, Asio itself would throw at
        // this co_await and gather's own check would never run.
        co_await sluice::gather_with_concurrency(2, calls(svc, 4));
      },
      asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e) { error = e; }));
  loop.run_for(100ms);
  cancel.emit(asio::cancellation_type::terminal);
  loop.run_for(5s);
  REQUIRE(error);
  CHECK_THROWS_AS(std::rethrow_exception(error), sluice::system_error);
  CHECK(svc.calls() == 0);
}

TEST_CASE("empty input completes at once with an empty result", "[gather]") {
  virtual_loop loop;
  auto r = loop.run(sluice::gather_with_concurrency(3, std::vector<asio::awaitable<int>>{}));
  CHECK(r.empty());
  auto s = loop.run(sluice::gather(std::vector<asio::awaitable<int>>{}, sluice::return_exceptions));
  CHECK(s.empty());
  loop.run(sluice::gather(std::vector<asio::awaitable<void>>{}));
  CHECK(loop.now() == 0s);
}

TEST_CASE("limit 0 throws invalid_argument before anything starts", "[gather]") {
  slow_service svc;
  std::size_t made = 0;
  sluice_test::lazy_tasks<asio::awaitable<int>> input(3, [&](std::size_t i) {
    ++made;
    return call_returning(svc, static_cast<int>(i));
  });
  CHECK_THROWS_AS(sluice::gather_with_concurrency(0, input), std::invalid_argument);
  CHECK_THROWS_AS(sluice::gather_with_concurrency(0, input, sluice::return_exceptions),
                  std::invalid_argument);
  CHECK(made == 0);
  CHECK(svc.calls() == 0);
}

TEST_CASE("variadic gather returns a tuple, void as monostate, all running at once", "[gather]") {
  virtual_loop loop;
  auto [a, b, c] = loop.run([]() -> asio::awaitable<std::tuple<int, std::monostate, int>> {
    co_return co_await sluice::gather(after(300ms, 1), sluice::sleep(200ms), after(100ms, 3));
  });
  CHECK(a == 1);
  CHECK(c == 3);
  (void)b;
  CHECK(loop.now() == 300ms);
}

TEST_CASE("variadic gather fails fast and cancels the others", "[gather]") {
  slow_service svc({.latency = latency::fixed(5s)});
  virtual_loop loop;
  CHECK_THROWS_WITH(loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::gather(call_returning(svc, 1), fail_after(1s, "boom"), svc.call());
  }),
                    "boom");
  CHECK(loop.now() == 1s);
  CHECK(svc.in_flight() == 0);
  CHECK(svc.cancellations() == 2);
}

TEST_CASE("gather of void tasks waits for all and returns nothing", "[gather]") {
  slow_service svc({.latency = latency::sequence({1s, 3s, 2s})});
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> v;
    for (int i = 0; i < 3; ++i) v.push_back(svc.call());
    co_await sluice::gather_with_concurrency(2, std::move(v));
  });
  CHECK(loop.now() == 3s);
  CHECK(svc.completed() == 3);
}

TEST_CASE("immediately completing tasks all run and keep their order", "[gather]") {
  virtual_loop loop;
  auto r = loop.run([]() -> asio::awaitable<std::vector<int>> {
    std::vector<asio::awaitable<int>> v;
    for (int i = 0; i < 1000; ++i)
      v.push_back([](int x) -> asio::awaitable<int> {
        co_return x;
      }(i));
    co_return co_await sluice::gather_with_concurrency(8, std::move(v));
  });
  REQUIRE(r.size() == 1000);
  for (int i = 0; i < 1000; ++i) REQUIRE(r[static_cast<std::size_t>(i)] == i);
}

TEST_CASE("a cancelled sibling's cleanup finishes before gather rethrows", "[gather]") {
  virtual_loop loop;
  bool cleaned_up = false;
  auto slow_cleanup = [&]() -> asio::awaitable<int> {
    std::exception_ptr cancelled;
    try {
      co_await sluice::sleep(10s);
    } catch (const sluice::system_error&) {
      cancelled = std::current_exception();
    }
    // Cancelled: release resources, which takes time of its own.
    co_await asio::this_coro::reset_cancellation_state();
    co_await sluice::sleep(500ms);
    cleaned_up = true;
    if (cancelled) std::rethrow_exception(cancelled);
    co_return 0;
  };
  bool cleaned_when_rethrown = false;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<int>> v;
    v.push_back(slow_cleanup());
    v.push_back(fail_after(1s, "boom"));
    try {
      co_await sluice::gather_with_concurrency(2, std::move(v));
    } catch (const std::runtime_error&) {
      cleaned_when_rethrown = cleaned_up;
    }
  });
  CHECK(cleaned_when_rethrown);
  CHECK(loop.now() == 1500ms);
}

TEST_CASE("tasks run on the awaiting coroutine's executor", "[gather]") {
  virtual_loop loop;
  auto strand = asio::make_strand(loop.get_executor());
  std::size_t on_strand = 0;
  auto probe = [&]() -> asio::awaitable<int> {
    co_await sluice::sleep(1ms);
    on_strand += strand.running_in_this_thread() ? 1 : 0;
    co_return 1;
  };
  std::vector<int> r;
  asio::co_spawn(
      strand,
      [&]() -> asio::awaitable<void> {
        std::vector<asio::awaitable<int>> v;
        for (int i = 0; i < 6; ++i) v.push_back(probe());
        r = co_await sluice::gather_with_concurrency(3, std::move(v));
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  loop.run_for(1s);
  CHECK(r.size() == 6);
  CHECK(on_strand == 6);
}

TEST_CASE("variadic gather with return_exceptions settles every task into a tuple of outcomes",
          "[gather]") {
  slow_service svc({.latency = latency::fixed(2s)});
  virtual_loop loop;
  auto [a, b, c] = loop.run(
      [&]() -> asio::awaitable<
                std::tuple<sluice::outcome<int>, sluice::outcome<int>, sluice::outcome<void>>> {
        co_return co_await sluice::gather(call_returning(svc, 7), fail_after(1s, "bad"), svc.call(),
                                          sluice::return_exceptions);
      });
  REQUIRE(a.has_value());
  CHECK(*a == 7);
  CHECK_THROWS_WITH(b.value(), "bad");
  CHECK(c.has_value());
  CHECK(svc.cancellations() == 0);  // the failure cancelled nothing
  CHECK(loop.now() == 2s);
}

// ---- adversarial review: cancellation, failures, lazy input, nesting --------

namespace {

// Emits terminal cancellation on `sig` after `d`.
asio::awaitable<void> cancel_after(nanoseconds d, asio::cancellation_signal& sig) {
  co_await sluice::sleep(d);
  sig.emit(asio::cancellation_type::terminal);
}

// Sleeps `d`, then fails with `what`; if cancelled first, fails with
// "cleanup of <what>" instead of the cancellation.
asio::awaitable<int> fail_differently_when_cancelled(nanoseconds d, std::string what) {
  try {
    co_await sluice::sleep(d);
  } catch (const sluice::system_error&) {
    throw std::runtime_error("cleanup of " + what);
  }
  throw std::runtime_error(what);
}

// Ignores cancellation: runs `d` to the end whatever happens.
asio::awaitable<int> stubborn(nanoseconds d, int v, int& finished) {
  co_await asio::this_coro::reset_cancellation_state(
      [](asio::cancellation_type) { return asio::cancellation_type::none; });
  co_await sluice::sleep(d);
  ++finished;
  co_return v;
}

// A lazy input whose operator++ throws when leaving item `throw_at`.
class throwing_advance {
  struct state {
    std::size_t n;
    std::size_t throw_at;
    std::function<asio::awaitable<int>(std::size_t)> make;
    std::size_t pos = 0;
  };

 public:
  class iterator {
   public:
    using value_type = asio::awaitable<int>;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    explicit iterator(state* s) : s_(s) {}
    asio::awaitable<int> operator*() const { return s_->make(s_->pos); }
    iterator& operator++() {
      if (s_->pos == s_->throw_at) throw sluice_test::input_broken();
      ++s_->pos;
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) {
      return it.s_->pos >= it.s_->n;
    }

   private:
    state* s_ = nullptr;
  };
  throwing_advance(std::size_t n, std::size_t throw_at,
                   std::function<asio::awaitable<int>(std::size_t)> make)
      : s_(std::make_shared<state>(state{n, throw_at, std::move(make)})) {}
  iterator begin() { return iterator(s_.get()); }
  std::default_sentinel_t end() { return {}; }

 private:
  std::shared_ptr<state> s_;
};

}  // namespace

TEST_CASE("a caller cancelled at t=0 before the loop ran starts nothing and nothing later",
          "[gather]") {
  slow_service svc({.latency = latency::fixed(1s)});
  virtual_loop loop;
  asio::cancellation_signal cancel;
  std::string how;
  // The request arrives while the caller waits on something that ignores it
  // (Asio 1.24+ would refuse to start a coroutine cancelled before co_spawn
  // ran it, by throwing out of run()); then the caller calls gather.
  asio::co_spawn(
      loop.get_executor(),
      [&]() -> asio::awaitable<std::string> {
        co_await asio::this_coro::throw_if_cancelled(false);
        asio::steady_timer parked(co_await asio::this_coro::executor, std::chrono::hours(1));
        sluice::error_code ec;
        co_await parked.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        // throw_if_cancelled stays off, so gather's own check is what is tested.
        co_return co_await sluice_test::ending_of(
            sluice::gather_with_concurrency(2, calls(svc, 4)));
      },
      sluice_test::bind_slot(cancel.slot(), [&](std::exception_ptr e, std::string s) {
        how = e ? sluice_test::ending_of_exception(e) : s;
      }));
  loop.poll();
  cancel.emit(asio::cancellation_type::terminal);
  loop.run_for(10s);
  CHECK(how == "aborted");
  CHECK(svc.calls() == 0);
}

TEST_CASE("a caller cancelled at the instant a task completes leaves nothing running after it",
          "[gather]") {
  slow_service svc({.latency = latency::fixed(100ms)});
  virtual_loop loop;
  asio::cancellation_signal cancel;
  std::string how;
  std::size_t calls_at_return = 0;
  auto tasks = calls(svc, 10);
  // The canceller's timer is set first, so it fires first at 100 ms.
  asio::co_spawn(loop.get_executor(), cancel_after(100ms, cancel), asio::detached);
  asio::co_spawn(
      loop.get_executor(),
      sluice_test::ending_of(sluice::gather_with_concurrency(2, std::move(tasks))),
      asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr, std::string s) {
        how = s;
        calls_at_return = svc.calls();
      }));
  loop.run_for(100ms);
  CHECK(how == "aborted");
  CHECK(svc.in_flight() == 0);
  loop.run_for(10s);
  CHECK(svc.calls() == calls_at_return);
  CHECK(svc.in_flight() == 0);
}

TEST_CASE("a failure just before the caller is cancelled in the same instant is still rethrown",
          "[gather]") {
  virtual_loop loop;
  asio::cancellation_signal cancel;
  std::string how;
  std::vector<asio::awaitable<int>> v;
  v.push_back(fail_after(100ms, "first"));
  v.push_back(after(1s, 1));
  v.push_back(after(1s, 2));
  asio::co_spawn(loop.get_executor(), sluice_test::ending_of(sluice::gather(std::move(v))),
                 asio::bind_cancellation_slot(cancel.slot(),
                                              [&](std::exception_ptr, std::string s) { how = s; }));
  // Set after the task's timer: fires after it at 100 ms.
  asio::co_spawn(loop.get_executor(), cancel_after(100ms, cancel), asio::detached);
  loop.run_for(5s);
  CHECK(how == "first");
  CHECK(loop.now() == 5s);
}

TEST_CASE("a timeout that fires at the instant the tasks finish leaves nothing running",
          "[gather]") {
  using namespace asio::experimental::awaitable_operators;
  slow_service svc({.latency = latency::fixed(1s)});
  virtual_loop loop;
  auto r = loop.run([&]() -> asio::awaitable<std::size_t> {
    auto v = co_await (sluice::gather_with_concurrency(2, calls(svc, 4)) || sluice::sleep(2s));
    co_return v.index();
  });
  CHECK(loop.now() == 2s);
  CHECK(svc.in_flight() == 0);
  const auto after_return = svc.calls();
  (void)r;
  loop.run_for(10s);
  CHECK(svc.calls() == after_return);
}

TEST_CASE("two failures at the same instant: the first in time is rethrown, the other dropped",
          "[gather]") {
  virtual_loop loop;
  auto how = loop.run([]() -> asio::awaitable<std::string> {
    std::vector<asio::awaitable<int>> v;
    v.push_back(after(1s, 0));
    v.push_back(fail_after(100ms, "a"));
    v.push_back(fail_after(100ms, "b"));
    co_return co_await sluice_test::ending_of(sluice::gather(std::move(v)));
  });
  CHECK(how == "a");
  CHECK(loop.now() == 100ms);
}

TEST_CASE("an input whose first element throws starts nothing and rethrows", "[gather]") {
  virtual_loop loop;
  int made = 0;
  sluice_test::lazy_tasks<asio::awaitable<int>> input(5, [&](std::size_t i) {
    ++made;
    return after(100ms, static_cast<int>(i));
  });
  input.throw_at(0);
  auto how = loop.run(sluice_test::ending_of(sluice::gather_with_concurrency(2, input)));
  CHECK(how == "the input range broke");
  CHECK(made == 0);
  CHECK(loop.now() == 0ms);
}

TEST_CASE("an input whose increment throws cancels the running tasks and rethrows", "[gather]") {
  slow_service svc({.latency = latency::fixed(1s)});
  virtual_loop loop;
  throwing_advance input(10, 3, [&](std::size_t i) { return call_returning(svc, int(i)); });
  auto how = loop.run(sluice_test::ending_of(sluice::gather_with_concurrency(3, input)));
  CHECK(how == "the input range broke");
  // Items 0..2 started at 0; item 3 was made at 1 s and its advance threw.
  CHECK(loop.now() == 1s);
  CHECK(svc.in_flight() == 0);
  CHECK(svc.calls() == 3);
  loop.run_for(10s);
  CHECK(svc.calls() == 3);
}

TEST_CASE("a task that throws its own error after being cancelled does not replace the first",
          "[gather]") {
  virtual_loop loop;
  auto how = loop.run([]() -> asio::awaitable<std::string> {
    std::vector<asio::awaitable<int>> v;
    v.push_back(fail_differently_when_cancelled(1s, "slow"));
    v.push_back(fail_after(100ms, "first"));
    v.push_back(fail_differently_when_cancelled(2s, "slower"));
    co_return co_await sluice_test::ending_of(sluice::gather(std::move(v)));
  });
  CHECK(how == "first");
  CHECK(loop.now() == 100ms);
}

TEST_CASE("a caller cancelled while tasks throw their own errors on cancel gets operation_aborted",
          "[gather]") {
  using namespace asio::experimental::awaitable_operators;
  virtual_loop loop;
  auto how = loop.run([]() -> asio::awaitable<std::string> {
    std::vector<asio::awaitable<int>> v;
    v.push_back(fail_differently_when_cancelled(1s, "x"));
    v.push_back(fail_differently_when_cancelled(1s, "y"));
    auto r =
        co_await (sluice_test::ending_of(sluice::gather(std::move(v))) || sluice::sleep(100ms));
    co_return r.index() == 1 ? std::string("timeout") : std::get<0>(r);
  });
  CHECK(how == "timeout");
  CHECK(loop.now() == 100ms);
}

TEST_CASE("gather waits for tasks that ignore cancellation before rethrowing", "[gather]") {
  virtual_loop loop;
  int finished = 0;
  auto how = loop.run([&]() -> asio::awaitable<std::string> {
    std::vector<asio::awaitable<int>> v;
    v.push_back(stubborn(3s, 0, finished));
    v.push_back(fail_after(100ms, "boom"));
    v.push_back(stubborn(2s, 2, finished));
    co_return co_await sluice_test::ending_of(sluice::gather(std::move(v)));
  });
  CHECK(how == "boom");
  CHECK(finished == 2);
  CHECK(loop.now() == 3s);
}

TEST_CASE("a cancelled caller also waits for tasks that ignore cancellation", "[gather]") {
  using namespace asio::experimental::awaitable_operators;
  virtual_loop loop;
  int finished = 0;
  auto r = loop.run([&]() -> asio::awaitable<std::size_t> {
    std::vector<asio::awaitable<int>> v;
    v.push_back(stubborn(3s, 0, finished));
    v.push_back(after(5s, 1));
    auto x = co_await (sluice::gather(std::move(v)) || sluice::sleep(1s));
    co_return x.index();
  });
  CHECK(r == 1);
  CHECK(finished == 1);
  CHECK(loop.now() == 3s);
}

TEST_CASE("limit 1 takes exactly the sum of the durations and pulls one at a time", "[gather]") {
  virtual_loop loop;
  std::vector<nanoseconds> pulled_at;
  sluice_test::lazy_tasks<asio::awaitable<int>> input(4, [&](std::size_t i) {
    pulled_at.push_back(loop.now());
    return after(milliseconds(100 * (i + 1)), static_cast<int>(i));
  });
  auto r = loop.run(sluice::gather_with_concurrency(1, input));
  CHECK(r == std::vector<int>{0, 1, 2, 3});
  CHECK(loop.now() == 1000ms);
  CHECK(pulled_at == std::vector<nanoseconds>{0ms, 100ms, 300ms, 600ms});
}

TEST_CASE("a limit larger than the input pulls each element exactly once", "[gather]") {
  virtual_loop loop;
  int made = 0;
  sluice_test::lazy_tasks<asio::awaitable<int>> input(3, [&](std::size_t i) {
    ++made;
    return after(100ms, static_cast<int>(i));
  });
  auto r = loop.run(sluice::gather_with_concurrency(100, input));
  CHECK(r == std::vector<int>{0, 1, 2});
  CHECK(made == 3);
  CHECK(input.pulled() == 3);
  CHECK(loop.now() == 100ms);
}

TEST_CASE("nothing is pulled from a lazy input after the caller was cancelled", "[gather]") {
  using namespace asio::experimental::awaitable_operators;
  virtual_loop loop;
  sluice_test::lazy_tasks<asio::awaitable<int>> input(
      100, [&](std::size_t i) { return after(100ms, static_cast<int>(i)); });
  loop.run([&]() -> asio::awaitable<void> {
    co_await (sluice::gather_with_concurrency(2, input) || sluice::sleep(250ms));
  });
  CHECK(input.pulled() == 6);
  loop.run_for(10s);
  CHECK(input.pulled() == 6);
}

TEST_CASE("nested gathers under a cancelled caller all stop, and nothing runs later", "[gather]") {
  using namespace asio::experimental::awaitable_operators;
  slow_service svc({.latency = latency::fixed(1s)});
  virtual_loop loop;
  auto inner = [&]() -> asio::awaitable<int> {
    auto r = co_await sluice::gather_with_concurrency(2, calls(svc, 4));
    co_return static_cast<int>(r.size());
  };
  auto r = loop.run([&]() -> asio::awaitable<std::size_t> {
    std::vector<asio::awaitable<int>> outer;
    for (int i = 0; i < 3; ++i) outer.push_back(inner());
    auto x = co_await (sluice::gather(std::move(outer)) || sluice::sleep(1500ms));
    co_return x.index();
  });
  CHECK(r == 1);
  CHECK(loop.now() == 1500ms);
  CHECK(svc.in_flight() == 0);
  CHECK(svc.calls() == 12);
  CHECK(svc.cancellations() == 6);
  loop.run_for(10s);
  CHECK(svc.calls() == 12);
}

TEST_CASE("a failure in one nested gather cancels the sibling gathers", "[gather]") {
  slow_service svc({.latency = latency::fixed(1s)});
  virtual_loop loop;
  auto how = loop.run([&]() -> asio::awaitable<std::string> {
    std::vector<asio::awaitable<int>> inner;
    inner.push_back(fail_after(1500ms, "inner failed"));
    inner.push_back(after(1s, 0));
    std::vector<asio::awaitable<std::vector<int>>> outer;
    outer.push_back(sluice::gather_with_concurrency(2, calls(svc, 4)));
    outer.push_back(sluice::gather_with_concurrency(2, std::move(inner)));
    co_return co_await sluice_test::ending_of(sluice::gather(std::move(outer)));
  });
  CHECK(how == "inner failed");
  CHECK(loop.now() == 1500ms);
  CHECK(svc.in_flight() == 0);
  CHECK(svc.calls() == 4);
  CHECK(svc.cancellations() == 2);
}

TEST_CASE("gather on a strand keeps order, fails fast and can be cancelled", "[gather]") {
  using namespace asio::experimental::awaitable_operators;
  slow_service svc({.latency = latency::fixed(1s)});
  virtual_loop loop;
  auto strand = asio::make_strand(loop.get_executor());
  std::vector<int> r;
  std::string failed, cancelled;
  asio::co_spawn(
      strand,
      [&]() -> asio::awaitable<void> {
        std::vector<asio::awaitable<int>> v;
        v.push_back(after(300ms, 0));
        v.push_back(after(100ms, 1));
        r = co_await sluice::gather_with_concurrency(2, std::move(v));
        std::vector<asio::awaitable<int>> w = calls(svc, 3);
        w.push_back(fail_after(100ms, "strand failure"));
        failed = co_await sluice_test::ending_of(sluice::gather(std::move(w)));
        auto x =
            co_await (sluice::gather_with_concurrency(2, calls(svc, 4)) || sluice::sleep(500ms));
        cancelled = x.index() == 1 ? "cancelled" : "ran";
      },
      asio::detached);
  loop.run_for(10s);
  CHECK(r == std::vector<int>{0, 1});
  CHECK(failed == "strand failure");
  CHECK(cancelled == "cancelled");
  CHECK(svc.in_flight() == 0);
  CHECK(svc.calls() == 5);
}
