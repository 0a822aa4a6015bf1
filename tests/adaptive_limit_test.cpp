// SPDX-License-Identifier: BSL-1.0
// DESIGN.md, "Providers that push back", semantic 2: an adaptive_limit against
// a provider whose capacity changes; the limit stays in [min, max]; FIFO and
// cancellation as semaphore's.
#include <sluice/adaptive_limit.hpp>

#include <sluice/gather.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>
#include <sluice/timeout.hpp>

#include <examples/support/capacity_scenario.hpp>
#include <support/asio.hpp>
#include <support/spawned.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice::adaptive_limit;
using sluice::testing::virtual_loop;
using sluice_test::tasks_on_loop;

namespace {

// A limit whose algorithm never moves it (AIMD with no increase, backoff 1).
adaptive_limit::options still(std::size_t initial, std::size_t min = 1, std::size_t max = 64) {
  return {.initial = initial,
          .min = min,
          .max = max,
          .algorithm = sluice::aimd{.increase = 0, .backoff = 1.0}};
}

// Takes every free place at once and reports each a success; returns how many.
template <class Executor>
std::size_t succeed_a_round(adaptive_limit& cap, const Executor& ex) {
  std::vector<adaptive_limit::permit> ps;
  while (auto p = cap.try_acquire(ex)) ps.push_back(std::move(p));
  for (auto& p : ps) p.succeeded();
  return ps.size();
}

void check_against_oracle(const sluice_examples::capacity::result& r,
                          const sluice_examples::capacity::result& oracle) {
  INFO(r.name << ": makespan " << std::chrono::duration<double>(r.makespan).count() << " s, oracle "
              << std::chrono::duration<double>(oracle.makespan).count() << " s, " << r.throttles
              << " of " << r.calls << " calls throttled");
  CHECK(r.calls >= sluice_examples::capacity::jobs);
  CHECK(r.throttles * 100 <= r.calls);               // at most 1% throttled
  CHECK(r.makespan * 100 <= oracle.makespan * 115);  // within 15% of the oracle
  CHECK(r.makespan >= oracle.makespan);              // (the oracle is a bound)
  for (const auto& [t, limit] : r.limit_trace) {
    CHECK(limit >= 1);
    CHECK(limit <= 64);
  }
}

}  // namespace

TEST_CASE("the oracle runs at the capacity and is never throttled", "[adaptive_limit][scenario]") {
  const auto oracle = sluice_examples::capacity::run_oracle();
  CHECK(oracle.throttles == 0);
  CHECK(oracle.calls == sluice_examples::capacity::jobs);
  CHECK(oracle.makespan > 10min);  // the last phase (capacity 12) is reached
  sluice::testing::slow_service svc(sluice_examples::capacity::service_options());
  for (const auto& [t, limit] : oracle.limit_trace)
    CHECK(limit == svc.capacity_at(std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::duration<double>(t))));
}

TEST_CASE(
    "aimd follows a capacity of 8 then 3 then 12 with at most 1% throttled and within 15% "
    "of the oracle",
    "[adaptive_limit][scenario]") {
  const auto oracle = sluice_examples::capacity::run_oracle();
  const auto r = sluice_examples::capacity::run_adaptive("aimd", sluice::aimd{});
  check_against_oracle(r, oracle);
  // Deterministic: the same run again gives the same figures.
  const auto again = sluice_examples::capacity::run_adaptive("aimd", sluice::aimd{});
  CHECK(again.makespan == r.makespan);
  CHECK(again.throttles == r.throttles);
}

TEST_CASE(
    "gradient follows a capacity of 8 then 3 then 12 with at most 1% throttled and within "
    "15% of the oracle",
    "[adaptive_limit][scenario]") {
  const auto oracle = sluice_examples::capacity::run_oracle();
  check_against_oracle(sluice_examples::capacity::run_adaptive("gradient", sluice::gradient{}),
                       oracle);
}

TEST_CASE("fixed limits either wait or are throttled where the adaptive limit is neither",
          "[adaptive_limit][scenario]") {
  const auto oracle = sluice_examples::capacity::run_oracle();
  const auto three = sluice_examples::capacity::run_fixed(3);
  const auto twelve = sluice_examples::capacity::run_fixed(12);
  CHECK(three.throttles == 0);
  CHECK(three.makespan * 100 > oracle.makespan * 150);  // half as fast again
  CHECK(twelve.throttles * 2 > twelve.calls);           // most calls throttled
}

namespace {
// 32 workers x 40 calls against a provider that throttles past 20 in flight
// and whose latency doubles at 9 in flight (1 + 2.5 (n - 1) / 20); returns
// the highest limit seen.
struct latency_run {
  std::size_t highest = 0, throttles = 0;
  std::chrono::nanoseconds baseline{};
};
template <class Algorithm>
latency_run run_under_rising_latency(Algorithm algorithm) {
  virtual_loop loop;
  sluice::testing::slow_service svc({.latency = sluice::testing::latency::fixed(1s),
                                     .capacity = {{0s, 20}},
                                     .load_latency = 2.5});
  adaptive_limit cap{{.initial = 1, .min = 1, .max = 64, .algorithm = algorithm}};
  latency_run r;
  loop.run([&]() -> asio::awaitable<void> {
    auto worker = [&]() -> asio::awaitable<void> {
      for (int i = 0; i < 40; ++i) {
        try {
          co_await cap.run([&] { return svc.call(); });
        } catch (const sluice::testing::throttled_error&) {
        }
        r.highest = std::max(r.highest, cap.limit());
      }
    };
    std::vector<asio::awaitable<void>> workers;
    for (int w = 0; w < 32; ++w) workers.push_back(worker());
    co_await sluice::gather(std::move(workers));
  });
  r.throttles = svc.throttles();
  r.baseline = cap.baseline();
  return r;
}
}  // namespace

TEST_CASE("the limit falls when latency rises above the baseline, before any throttle",
          "[adaptive_limit]") {
  const auto g = run_under_rising_latency(sluice::gradient{});
  CHECK(g.throttles == 0);
  CHECK(g.baseline == 1s);  // the first call ran alone
  // Twice the idle latency at 9 in flight: the limit stops growing near there.
  CHECK(g.highest >= 6);
  CHECK(g.highest <= 12);
  // AIMD, blind to latency, grows until the provider throttles.
  const auto a = run_under_rising_latency(sluice::aimd{});
  CHECK(a.throttles > 0);
  CHECK(a.highest > 20);
}

TEST_CASE("aimd adds one per round of successes and multiplies by backoff on a throttle",
          "[adaptive_limit]") {
  tasks_on_loop h;
  adaptive_limit cap{{.initial = 4,
                      .min = 1,
                      .max = 64,
                      .algorithm = sluice::aimd{.increase = 1, .backoff = 0.5}}};
  auto ex = h.loop.get_executor();
  auto round = [&] {
    const std::size_t n = cap.limit();
    REQUIRE(succeed_a_round(cap, ex) == n);
  };
  round();
  CHECK(cap.limit() == 4);  // 4 + 4 * 1/4 ... just under 5 in floating point, or 5
  round();
  CHECK(cap.limit() >= 5);
  const std::size_t before = cap.limit();
  // Two throttles from permits granted before the decrease: one congestion event.
  auto a = cap.try_acquire(ex);
  auto b = cap.try_acquire(ex);
  a.throttled();
  CHECK(cap.limit() == before / 2);
  b.throttled();
  CHECK(cap.limit() == before / 2);
  CHECK(cap.throttles() == 2);
  // A permit granted after it reports a new event.
  auto c = cap.try_acquire(ex);
  c.throttled();
  CHECK(cap.limit() == std::max<std::size_t>(1, before / 4));
}

TEST_CASE("the limit never leaves min and max", "[adaptive_limit]") {
  tasks_on_loop h;
  adaptive_limit cap{{.initial = 3,
                      .min = 2,
                      .max = 5,
                      .algorithm = sluice::aimd{.increase = 1, .backoff = 0.5, .hold = 0}}};
  auto ex = h.loop.get_executor();
  for (int i = 0; i < 20; ++i) {
    cap.try_acquire(ex).throttled();
    CHECK(cap.limit() == 2);
  }
  for (int i = 0; i < 200; ++i) {
    succeed_a_round(cap, ex);
    CHECK(cap.limit() >= 2);
    CHECK(cap.limit() <= 5);
  }
  CHECK(cap.limit() == 5);
  cap.set_limit(100);
  CHECK(cap.limit() == 5);
  cap.set_limit(0);
  CHECK(cap.limit() == 2);
}

TEST_CASE("lowering the limit below in_flight revokes nothing and grants nobody until below it",
          "[adaptive_limit]") {
  tasks_on_loop h;
  adaptive_limit cap{still(4)};
  auto ex = h.loop.get_executor();
  std::vector<adaptive_limit::permit> held;
  for (int i = 0; i < 4; ++i) held.push_back(cap.try_acquire(ex));
  auto& w = h.spawn([&]() -> asio::awaitable<void> { auto p = co_await cap.scoped_acquire(); });
  h.poll();
  CHECK(cap.waiters() == 1);
  cap.set_limit(2);
  CHECK(cap.limit() == 2);
  CHECK(cap.in_flight() == 4);
  held[0].reset();
  held[1].succeeded();
  h.poll();
  CHECK(cap.in_flight() == 2);
  CHECK_FALSE(w.done);  // 2 in flight, limit 2: still waiting
  held[2].reset();
  h.poll();
  CHECK(w.succeeded());
  CHECK(cap.in_flight() == 1);
  held[3].reset();
  CHECK(cap.in_flight() == 0);
  CHECK(cap.try_acquire(ex));
}

TEST_CASE("raising the limit hands the new places to the oldest waiters", "[adaptive_limit]") {
  tasks_on_loop h;
  adaptive_limit cap{still(1)};
  auto held = cap.try_acquire(h.loop.get_executor());
  std::vector<int> order;
  std::vector<adaptive_limit::permit> got;
  for (int i = 1; i <= 4; ++i) {
    h.spawn([&, i]() -> asio::awaitable<void> {
      got.push_back(co_await cap.scoped_acquire());
      order.push_back(i);
    });
  }
  h.poll();
  CHECK(cap.waiters() == 4);
  cap.set_limit(3);
  h.poll();
  CHECK(order == std::vector<int>{1, 2});
  CHECK(cap.in_flight() == 3);
  held.reset();
  h.poll();
  CHECK(order == std::vector<int>{1, 2, 3});
  CHECK(cap.waiters() == 1);
}

TEST_CASE("holders are served in FIFO order c1_1 c2_1 c3_1 c1_2 c2_2 c3_2", "[adaptive_limit]") {
  virtual_loop loop;
  adaptive_limit cap{still(1)};
  std::vector<std::string> result;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto coro = [&](std::string tag) -> asio::awaitable<void> {
      for (const char* n : {"_1", "_2"}) {
        auto p = co_await cap.scoped_acquire();
        result.push_back(tag + n);
        co_await sluice::sleep(10ms);
        p.succeeded();
      }
    };
    co_await (coro("c1") && coro("c2") && coro("c3"));
  });
  CHECK(result == std::vector<std::string>{"c1_1", "c2_1", "c3_1", "c1_2", "c2_2", "c3_2"});
  CHECK(loop.now() == 60ms);
}

TEST_CASE("a cancelled waiter is skipped and holds nothing", "[adaptive_limit]") {
  tasks_on_loop h;
  adaptive_limit cap{still(1)};
  auto held = cap.try_acquire(h.loop.get_executor());
  std::vector<int> order;
  std::vector<sluice_test::task*> t;
  for (int i = 1; i <= 3; ++i) {
    t.push_back(&h.spawn([&, i]() -> asio::awaitable<void> {
      auto p = co_await cap.scoped_acquire();
      order.push_back(i);
    }));
  }
  h.poll();
  t[0]->cancel();
  h.poll();
  CHECK(t[0]->cancelled());
  CHECK(cap.waiters() == 2);
  held.reset();
  h.poll();
  CHECK(order == std::vector<int>{2, 3});
  CHECK(cap.in_flight() == 0);
}

TEST_CASE("a waiter granted then cancelled before it resumes hands its place to the next",
          "[adaptive_limit]") {
  tasks_on_loop h;
  adaptive_limit cap{still(1)};
  auto ex = h.loop.get_executor();
  auto held = cap.try_acquire(ex);
  std::vector<int> order;
  std::vector<adaptive_limit::permit> got;
  std::vector<sluice_test::task*> t;
  for (int i = 1; i <= 3; ++i) {
    t.push_back(&h.spawn([&, i]() -> asio::awaitable<void> {
      got.push_back(co_await cap.scoped_acquire());
      order.push_back(i);
    }));
  }
  h.poll();
  held.reset();    // 1 granted
  t[0]->cancel();  // ...and cancelled before it runs: its place goes on to 2
  h.poll();
  CHECK(t[0]->cancelled());
  CHECK(order == std::vector<int>{2});
  CHECK(cap.in_flight() == 1);
  CHECK(cap.waiters() == 1);
}

TEST_CASE("a waiter granted, then the limit lowered, then cancelled returns its place to nobody",
          "[adaptive_limit]") {
  tasks_on_loop h;
  adaptive_limit cap{still(2)};
  auto ex = h.loop.get_executor();
  auto a = cap.try_acquire(ex);
  auto b = cap.try_acquire(ex);
  std::vector<adaptive_limit::permit> got;
  auto& t1 =
      h.spawn([&]() -> asio::awaitable<void> { got.push_back(co_await cap.scoped_acquire()); });
  auto& t2 =
      h.spawn([&]() -> asio::awaitable<void> { got.push_back(co_await cap.scoped_acquire()); });
  h.poll();
  a.reset();         // t1 granted (2 in flight)
  cap.set_limit(1);  // 2 in flight, limit 1
  t1.cancel();       // t1 passes its place on: absorbed, t2 keeps waiting
  h.poll();
  CHECK(t1.cancelled());
  CHECK_FALSE(t2.done);
  CHECK(cap.in_flight() == 1);
  b.reset();
  h.poll();
  CHECK(t2.succeeded());
  CHECK(cap.in_flight() == 1);
}

TEST_CASE("a caller cancelled before it called waits for nothing and holds nothing",
          "[adaptive_limit]") {
  tasks_on_loop h;
  adaptive_limit cap{still(1)};
  auto held = cap.try_acquire(h.loop.get_executor());
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      co_await sluice::sleep(1h);  // cancelled here...
    } catch (const sluice::system_error&) {
    }
    co_await asio::this_coro::throw_if_cancelled(true);
    auto p = co_await cap.scoped_acquire();  // ...then calls
  });
  h.poll();
  t.cancel();
  h.poll();
  CHECK(t.cancelled());
  CHECK(cap.waiters() == 0);
  CHECK(cap.in_flight() == 1);
  held.reset();
  CHECK(cap.in_flight() == 0);
}

TEST_CASE("a timeout racing with a grant never loses a place", "[adaptive_limit]") {
  virtual_loop loop;
  adaptive_limit cap{still(1)};
  int got = 0, timed_out = 0;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto holder = [&]() -> asio::awaitable<void> {
      auto p = co_await cap.scoped_acquire();
      co_await sluice::sleep(1s);
    };
    auto contender = [&]() -> asio::awaitable<void> {
      auto r = co_await (cap.scoped_acquire() || sluice::sleep(1s));
      (r.index() == 0 ? got : timed_out) += 1;
    };
    co_await (holder() && contender() && contender());
  });
  CHECK(got + timed_out == 2);
  CHECK(cap.in_flight() == 0);
  CHECK(cap.waiters() == 0);
}

TEST_CASE("run reports success, throttles, timeouts and other errors and rethrows them unchanged",
          "[adaptive_limit]") {
  virtual_loop loop;
  sluice::testing::slow_service svc({.latency = sluice::testing::latency::fixed(2s),
                                     .failure = sluice::testing::failures::at_calls({1}),
                                     .quota = {.max_in_flight = 1}});
  adaptive_limit cap{still(4)};
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    const int v = co_await cap.run([&]() -> asio::awaitable<int> {
      co_await svc.call();
      co_return 7;
    });
    CHECK(v == 7);
    CHECK(cap.successes() == 1);
    CHECK_THROWS_AS(co_await cap.run([&] { return svc.call(); }),
                    sluice::testing::service_error);  // call 1 fails: ignored
    CHECK(cap.successes() == 1);
    CHECK(cap.throttles() == 0);
    auto busy = [&]() -> asio::awaitable<void> {
      co_await cap.run([&] { return svc.call(); });
    };
    auto refused = [&]() -> asio::awaitable<void> {
      co_await sluice::sleep(1s);
      CHECK_THROWS_AS(co_await cap.run([&] { return svc.call(); }),
                      sluice::testing::throttled_error);
    };
    co_await (busy() && refused());
    CHECK(cap.throttles() == 1);
    CHECK_THROWS_AS(co_await cap.run([&]() -> asio::awaitable<void> {
      throw sluice::timeout_error(1s);
      co_return;
    }),
                    sluice::timeout_error);
    CHECK(cap.drops() == 1);
    auto as_throttle = [](const std::exception_ptr&) {
      return adaptive_limit::outcome::throttled;
    };
    CHECK_THROWS_AS(co_await cap.run(
                        []() -> asio::awaitable<void> {
                          throw std::runtime_error("503");
                          co_return;
                        },
                        as_throttle),
                    std::runtime_error);
    CHECK(cap.throttles() == 2);
    CHECK(cap.in_flight() == 0);
  });
  CHECK(cap.successes() == 2);
}

TEST_CASE("run releases its place when the caller is cancelled during the call",
          "[adaptive_limit]") {
  tasks_on_loop h;
  adaptive_limit cap{still(1)};
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    co_await cap.run([]() -> asio::awaitable<void> { co_await sluice::sleep(1h); });
  });
  h.poll();
  CHECK(cap.in_flight() == 1);
  t.cancel();
  h.poll();
  CHECK(t.cancelled());
  CHECK(cap.in_flight() == 0);
  CHECK(cap.successes() + cap.throttles() + cap.drops() == 0);
}

TEST_CASE("latency is measured on the executor's clock from the grant", "[adaptive_limit]") {
  virtual_loop loop;
  adaptive_limit cap{{.initial = 1, .min = 1, .max = 8, .algorithm = sluice::vegas{}}};
  loop.run([&]() -> asio::awaitable<void> {
    auto p = co_await cap.scoped_acquire();
    co_await sluice::sleep(3s);
    CHECK(p.elapsed() == 3s);
    p.succeeded();
    CHECK_FALSE(p);
  });
  CHECK(cap.baseline() == 3s);
}

TEST_CASE("bad options are rejected with invalid_argument", "[adaptive_limit]") {
  using opts = adaptive_limit::options;
  CHECK_THROWS_AS(adaptive_limit(opts{.initial = 1, .min = 0}), std::invalid_argument);
  CHECK_THROWS_AS(adaptive_limit(opts{.initial = 1, .min = 2, .max = 4}), std::invalid_argument);
  CHECK_THROWS_AS(adaptive_limit(opts{.initial = 5, .min = 1, .max = 4}), std::invalid_argument);
  CHECK_THROWS_AS(adaptive_limit(opts{.min = 5, .max = 4}), std::invalid_argument);
  CHECK_THROWS_AS(adaptive_limit(opts{.algorithm = sluice::aimd{.backoff = 0}}),
                  std::invalid_argument);
  CHECK_THROWS_AS(adaptive_limit(opts{.algorithm = sluice::gradient{.tolerance = 1.0}}),
                  std::invalid_argument);
  CHECK_THROWS_AS(adaptive_limit(opts{.algorithm = sluice::vegas{.alpha = 4, .beta = 2}}),
                  std::invalid_argument);
  CHECK_NOTHROW(adaptive_limit(opts{}));
}

TEST_CASE("a place freed by a throttle is absorbed by the decrease, not handed to a waiter",
          "[adaptive_limit]") {
  tasks_on_loop h;
  adaptive_limit cap{{.initial = 4,
                      .min = 1,
                      .max = 64,
                      .algorithm = sluice::aimd{.increase = 1, .backoff = 0.5}}};
  auto ex = h.loop.get_executor();
  std::vector<adaptive_limit::permit> held;
  for (int i = 0; i < 4; ++i) held.push_back(cap.try_acquire(ex));
  auto& w = h.spawn([&]() -> asio::awaitable<void> { auto p = co_await cap.scoped_acquire(); });
  h.poll();
  held[0].throttled();  // limit 4 -> 2 with 3 in flight: the waiter must not go
  h.poll();
  CHECK(cap.limit() == 2);
  CHECK(cap.in_flight() == 3);
  CHECK_FALSE(w.done);
  held[1].reset();
  held[2].reset();
  h.poll();
  CHECK(w.succeeded());
}

TEST_CASE("the documented snippet: a 429 from run lowers the limit", "[adaptive_limit]") {
  virtual_loop loop;
  sluice::testing::slow_service llm({.quota = {.max_in_flight = 2}});
  // docs/provider-limits.md, "Adaptive concurrency":
  sluice::adaptive_limit cap{{.initial = 4, .min = 1, .max = 64, .algorithm = sluice::aimd{}}};
  auto ask = [&](std::string prompt) -> asio::awaitable<void> {
    co_await cap.run([&] { return llm.call(prompt); });  // a 429 lowers the limit
  };
  int throttled = 0;
  auto one = [&](std::string prompt) -> asio::awaitable<void> {
    try {
      co_await ask(std::move(prompt));
    } catch (const sluice::testing::throttled_error&) {
      ++throttled;
    }
  };
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    co_await (one("a") && one("b") && one("c") && one("d"));
  });
  CHECK(throttled == 2);
  CHECK(cap.throttles() == 2);
  CHECK(cap.limit() == 3);  // 4 x 0.9: one congestion event, however many 429s it caused
  CHECK(cap.successes() == 2);
}

TEST_CASE(
    "a seeded random interleaving of outcomes, limit changes, timeouts and cancels loses no "
    "place and never grants over the limit",
    "[adaptive_limit][stress]") {
  const unsigned seed = GENERATE(1u, 2u, 3u, 42u);
  virtual_loop loop;
  adaptive_limit cap{{.initial = 3,
                      .min = 1,
                      .max = 6,
                      .algorithm = sluice::aimd{.increase = 1, .backoff = 0.5, .hold = 3}}};
  std::mt19937 rng(seed);
  auto pick = [&](int n) {
    return static_cast<int>(rng() % static_cast<unsigned>(n));
  };
  int held = 0, granted = 0, timed_out = 0, over = 0;
  std::vector<std::size_t> limits_seen;
  auto check_now = [&] {
    CHECK(cap.limit() >= 1);
    CHECK(cap.limit() <= 6);
    CHECK(cap.in_flight() >= static_cast<std::size_t>(held));
    if (cap.waiters() > 0 && cap.in_flight() < cap.limit()) ++over;  // someone should have gone
  };
  auto worker = [&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    for (int i = 0; i < 40; ++i) {
      auto r =
          co_await (cap.scoped_acquire() || sluice::sleep(std::chrono::milliseconds(pick(40))));
      if (r.index() == 1) {
        ++timed_out;
        continue;
      }
      auto p = std::move(std::get<0>(r));
      ++held;
      ++granted;
      check_now();
      co_await sluice::sleep(std::chrono::milliseconds(1 + pick(30)));
      --held;
      switch (pick(5)) {
        case 0:
          p.throttled();
          break;
        case 1:
          p.dropped();
          break;
        case 2:
          p.reset();
          break;
        default:
          p.succeeded();
          break;
      }
      check_now();
    }
  };
  auto knob = [&]() -> asio::awaitable<void> {
    for (int i = 0; i < 60; ++i) {
      co_await sluice::sleep(std::chrono::milliseconds(pick(25)));
      cap.set_limit(static_cast<std::size_t>(pick(8)));
      limits_seen.push_back(cap.limit());
      check_now();
    }
  };
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> all;
    for (int w = 0; w < 8; ++w) all.push_back(worker());
    all.push_back(knob());
    co_await sluice::gather(std::move(all));
  });
  CHECK(over == 0);
  CHECK(granted > 100);
  CHECK(timed_out > 5);
  CHECK(cap.in_flight() == 0);
  CHECK(cap.waiters() == 0);
  CHECK(std::count(limits_seen.begin(), limits_seen.end(), std::size_t{1}) > 0);  // clamped to min
  // Every place is back: exactly limit() can be taken now.
  std::vector<adaptive_limit::permit> all;
  while (auto p = cap.try_acquire(loop.get_executor())) all.push_back(std::move(p));
  CHECK(all.size() == cap.limit());
}

TEST_CASE("a classify that throws ends run with callback_error, the call's error nested",
          "[adaptive_limit]") {
  virtual_loop loop;
  adaptive_limit cap{still(2)};
  struct provider_down : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  const void* thrown = nullptr;
  const void* nested = nullptr;
  std::string what;
  loop.run([&]() -> asio::awaitable<void> {
    try {
      co_await cap.run(
          [&]() -> asio::awaitable<void> {
            try {
              throw provider_down("502");
            } catch (const provider_down& e) {
              thrown = &e;
              throw;
            }
            co_return;
          },
          [](const std::exception_ptr&) -> adaptive_limit::outcome {
            throw std::logic_error("classifier bug");
          });
    } catch (const sluice::callback_error& e) {
      what = e.what();
      try {
        std::rethrow_if_nested(e);
      } catch (const provider_down& original) {
        nested = &original;
      }
    }
  });
  CHECK(what == "sluice::adaptive_limit::run: classify threw: classifier bug");
  CHECK(nested != nullptr);
  CHECK(nested == thrown);
  CHECK(cap.in_flight() == 0);  // the place is back
  CHECK(cap.throttles() + cap.drops() + cap.successes() == 0);
}

TEST_CASE("after many rounds at max, one throttle lowers the limit to floor(max * backoff)",
          "[adaptive_limit]") {
  // The estimate is clamped at max: successes at max do not pile up above it
  // (which would make the next decrease land above max, absorbed unseen).
  tasks_on_loop h;
  adaptive_limit cap{{.initial = 8,
                      .min = 1,
                      .max = 8,
                      .algorithm = sluice::aimd{.increase = 1, .backoff = 0.5, .hold = 0}}};
  auto ex = h.loop.get_executor();
  for (int round = 0; round < 100; ++round) REQUIRE(succeed_a_round(cap, ex) == 8);
  CHECK(cap.limit() == 8);
  cap.try_acquire(ex).throttled();
  CHECK(cap.limit() == 4);
  cap.try_acquire(ex).throttled();
  CHECK(cap.limit() == 2);
}

TEST_CASE(
    "a permit released after its virtual loop died reads nothing freed; the next loop is served",
    "[adaptive_limit][lifetime]") {
  // A virtual loop per batch: permits may outlive theirs. They read the time
  // the loop ended at (ASan: heap-use-after-free of the loop's clock before).
  adaptive_limit cap{still(2)};
  adaptive_limit::permit waited, taken;
  {
    virtual_loop loop;
    loop.run([&]() -> asio::awaitable<void> {
      waited = co_await cap.scoped_acquire();
      co_await sluice::sleep(1s);
      taken = cap.try_acquire(loop.get_executor());
      co_await sluice::sleep(1s);
    });
  }
  CHECK(waited.elapsed() == 2s);
  CHECK(taken.elapsed() == 1s);
  waited.succeeded();
  taken.reset();
  CHECK(cap.in_flight() == 0);
  CHECK(cap.successes() == 1);

  // The next batch, on a new loop: exact figures.
  virtual_loop loop;
  auto hold = [&](std::chrono::seconds wait, std::chrono::seconds d) -> asio::awaitable<void> {
    auto p = co_await cap.scoped_acquire();
    CHECK(loop.now() == wait);
    co_await sluice::sleep(d);
    CHECK(p.elapsed() == d);
    p.succeeded();
  };
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> calls;
    calls.push_back(hold(0s, 3s));
    calls.push_back(hold(0s, 1s));
    calls.push_back(hold(1s, 2s));  // waits for the second
    co_await sluice::gather(std::move(calls));
  });
  CHECK(loop.now() == 3s);
  CHECK(cap.in_flight() == 0);
  CHECK(cap.successes() == 4);
  const auto s = cap.stats();
  CHECK(s.acquired == 5);
  CHECK(s.wait.count == 5);
  CHECK(s.wait.total == 1s);
  CHECK(s.wait.max == 1s);
  CHECK(s.hold.count == 5);
  CHECK(s.hold.total == 9s);  // 2 + 1, then 3 + 1 + 2
  CHECK(s.hold.max == 3s);
}
