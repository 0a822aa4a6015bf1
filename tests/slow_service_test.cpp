// SPDX-License-Identifier: BSL-1.0
#include <sluice/gather.hpp>
#include <sluice/retry.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

using namespace std::chrono_literals;
using namespace sluice::testing;

namespace {
std::vector<asio::awaitable<void>> calls(slow_service& svc, std::vector<std::string> keys) {
  std::vector<asio::awaitable<void>> v;
  for (auto& k : keys) v.push_back(svc.call(k));
  return v;
}
}  // namespace

TEST_CASE("a call takes the latency its model gives it", "[slow_service]") {
  slow_service svc({.latency = latency::sequence({1s, 2s, 500ms})});
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    for (int i = 0; i < 4; ++i) co_await svc.call();
  });
  CHECK(loop.now() == 4500ms);  // 1 + 2 + 0.5 + 1 (the list cycles)
  REQUIRE(svc.timeline().size() == 4);
  CHECK(svc.timeline()[1].start == 1s);
  CHECK(svc.timeline()[1].end == 3s);
  CHECK(svc.timeline()[3].result == call_result::ok);
}

TEST_CASE("uniform latency is deterministic per seed and stays in range", "[slow_service]") {
  auto a = latency::uniform(1s, 5s, 42);
  auto b = latency::uniform(1s, 5s, 42);
  auto c = latency::uniform(1s, 5s, 43);
  bool differs = false;
  for (std::size_t i = 0; i < 200; ++i) {
    const call_info info{i, "", ""};
    CHECK(a(info) == b(info));
    CHECK(a(info) >= 1s);
    CHECK(a(info) <= 5s);
    differs = differs || a(info) != c(info);
  }
  CHECK(differs);
}

TEST_CASE("a latency function sees the key and the operation", "[slow_service]") {
  slow_service svc({.latency = latency::from([](const call_info& c) {
                      return c.op == "slow" ? std::chrono::nanoseconds(3s)
                                            : std::chrono::nanoseconds(1s);
                    })});
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    co_await svc.call("k", "slow");
    co_await svc.call("k", "fast");
  });
  CHECK(loop.now() == 4s);
}

TEST_CASE("failures are injected by call index, by key and by seeded probability",
          "[slow_service]") {
  {
    slow_service svc({.latency = latency::fixed(1s), .failure = failures::at_calls({1})});
    virtual_loop loop;
    auto r = loop.run(sluice::gather(calls(svc, {"a", "b", "c"}), sluice::return_exceptions));
    CHECK(r[0]);
    CHECK_FALSE(r[1]);
    CHECK(r[2]);
    CHECK(svc.failures() == 1);
    CHECK(svc.timeline()[1].result == call_result::failed);
    CHECK(svc.timeline()[1].end == 1s);  // fails after its latency, like a real error response
  }
  {
    slow_service svc({.latency = latency::fixed(1s), .failure = failures::for_keys({"bad"})});
    virtual_loop loop;
    auto r = loop.run(
        sluice::gather(calls(svc, {"ok", "bad", "ok2", "bad"}), sluice::return_exceptions));
    CHECK(svc.failures() == 2);
    try {
      r[1].value();
    } catch (const service_error& e) {
      CHECK(e.key() == "bad");
      CHECK(e.index() == 1);
    }
  }
  {
    auto count = [](std::uint64_t seed) {
      slow_service svc(
          {.latency = latency::fixed(1ms), .failure = failures::probability(0.25, seed)});
      virtual_loop loop;
      std::vector<std::string> keys(400);
      loop.run(sluice::gather(calls(svc, keys), sluice::return_exceptions));
      return svc.failures();
    };
    CHECK(count(9) == count(9));
    CHECK(count(9) > 60);
    CHECK(count(9) < 140);
  }
}

TEST_CASE("a provider quota on calls in flight throttles the excess at once", "[slow_service]") {
  slow_service svc({.latency = latency::fixed(1s), .quota = {.max_in_flight = 3}});
  virtual_loop loop;
  auto r =
      loop.run(sluice::gather(calls(svc, std::vector<std::string>(5)), sluice::return_exceptions));
  CHECK(svc.throttles() == 2);
  CHECK(svc.completed() == 3);
  CHECK_THROWS_AS(r[3].value(), throttled_error);
  CHECK(svc.timeline()[4].result == call_result::throttled);
  CHECK(svc.timeline()[4].end == 0s);

  slow_service bounded({.latency = latency::fixed(1s), .quota = {.max_in_flight = 3}});
  virtual_loop loop2;
  loop2.run(sluice::gather_with_concurrency(3, calls(bounded, std::vector<std::string>(9))));
  CHECK(bounded.throttles() == 0);
  CHECK(loop2.now() == 3s);
}

TEST_CASE("a provider quota of M calls per window throttles the M+1th call in the window",
          "[slow_service]") {
  slow_service svc(
      {.latency = latency::fixed(100ms), .quota = {.calls_per_window = 2, .window = 1s}});
  virtual_loop loop;
  int throttled = 0;
  loop.run([&]() -> asio::awaitable<void> {
    for (int i = 0; i < 3; ++i) {
      try {
        co_await svc.call();
      } catch (const throttled_error&) {
        ++throttled;
      }
    }
    co_await sluice::sleep(1s);
    co_await svc.call();  // the window has moved on
  });
  CHECK(throttled == 1);
  CHECK(svc.completed() == 3);
}

TEST_CASE("a per-key quota on calls in flight throttles only the busy key", "[slow_service]") {
  slow_service svc({.latency = latency::fixed(1s), .key_quota = {.max_in_flight = 1}});
  virtual_loop loop;
  auto r = loop.run(sluice::gather(calls(svc, {"acme", "acme", "globex", "acme", "", ""}),
                                   sluice::return_exceptions));
  CHECK(svc.throttles() == 2);
  CHECK(svc.throttles("acme") == 2);
  CHECK(svc.throttles("globex") == 0);
  CHECK(svc.calls("acme") == 3);
  CHECK(svc.calls("globex") == 1);
  CHECK(svc.completed() == 4);  // acme once, globex once, and both calls without a key
  CHECK(r[0].has_value());
  CHECK_THROWS_AS(r[1].value(), throttled_error);
  CHECK(r[2].has_value());
  CHECK_THROWS_AS(r[3].value(), throttled_error);
  CHECK(r[4].has_value());
  CHECK(r[5].has_value());
  // A throttled call never entered: no collision, nothing more in flight.
  CHECK(svc.collisions("acme") == 0);
  CHECK(svc.max_in_flight("acme") == 1);
  CHECK(svc.timeline()[1].result == call_result::throttled);
  CHECK(svc.timeline()[1].end == 0s);
}

TEST_CASE("a per-key quota of N in flight admits exactly N per key", "[slow_service]") {
  slow_service svc({.latency = latency::fixed(1s), .key_quota = {.max_in_flight = 2}});
  virtual_loop loop;
  auto r =
      loop.run(sluice::gather(calls(svc, {"a", "a", "a", "b", "b"}), sluice::return_exceptions));
  CHECK(svc.throttles("a") == 1);
  CHECK(svc.throttles("b") == 0);
  CHECK(svc.max_in_flight("a") == 2);
  CHECK(svc.collisions("a") == 1);  // the second admitted call overlapped the first
  CHECK_THROWS_AS(r[2].value(), throttled_error);
}

TEST_CASE("a per-key quota of M calls per window counts each key's own window", "[slow_service]") {
  slow_service svc(
      {.latency = latency::fixed(100ms), .key_quota = {.calls_per_window = 2, .window = 1s}});
  virtual_loop loop;
  std::vector<std::string> seen;
  loop.run([&]() -> asio::awaitable<void> {
    auto attempt = [&](std::string key) -> asio::awaitable<void> {
      try {
        co_await svc.call(key);
        seen.push_back(key + " ok");
      } catch (const throttled_error&) {
        seen.push_back(key + " throttled");
      }
    };
    co_await attempt("a");          // t = 0
    co_await attempt("a");          // t = 0.1
    co_await attempt("b");          // t = 0.2: b has its own window
    co_await attempt("a");          // t = 0.3: third start of a within 1 s
    co_await sluice::sleep(600ms);  // t = 0.9
    co_await attempt("a");          // still within 1 s of the first start
    co_await sluice::sleep(100ms);  // t = 1.0: the first start left the window
    co_await attempt("a");
  });
  CHECK(seen ==
        std::vector<std::string>{"a ok", "a ok", "b ok", "a throttled", "a throttled", "a ok"});
  CHECK(svc.throttles("a") == 2);
  CHECK(svc.throttles() == 2);
  CHECK(svc.calls("a") == 5);
  CHECK(loop.now() == 1100ms);
}

TEST_CASE("the global quota and the per-key quota both apply", "[slow_service]") {
  slow_service svc({.latency = latency::fixed(1s),
                    .quota = {.max_in_flight = 2},
                    .key_quota = {.max_in_flight = 1}});
  virtual_loop loop;
  auto r = loop.run(sluice::gather(calls(svc, {"a", "a", "b", "c"}), sluice::return_exceptions));
  CHECK_THROWS_AS(r[1].value(), throttled_error);  // per key
  CHECK_THROWS_AS(r[3].value(), throttled_error);  // globally: a and b in flight
  CHECK(svc.throttles() == 2);
  CHECK(svc.throttles("a") == 1);
  CHECK(svc.throttles("c") == 1);
  CHECK(svc.completed() == 2);
}

TEST_CASE("collisions count calls for a key that start while another is in flight",
          "[slow_service]") {
  slow_service svc({.latency = latency::fixed(1s)});
  virtual_loop loop;
  loop.run(sluice::gather(calls(svc, {"acct-1", "acct-1", "acct-2", "acct-1"})));
  CHECK(svc.collisions("acct-1") == 2);
  CHECK(svc.collisions("acct-2") == 0);
  CHECK(svc.collisions() == 2);
  CHECK(svc.max_in_flight("acct-1") == 3);
  CHECK(svc.in_flight("acct-1") == 0);
  CHECK(svc.max_in_flight() == 4);
}

TEST_CASE("a cancelled call is recorded and leaves nothing in flight", "[slow_service]") {
  slow_service svc({.latency = latency::fixed(10s)});
  virtual_loop loop;
  using namespace asio::experimental::awaitable_operators;
  loop.run([&]() -> asio::awaitable<void> { co_await (svc.call("k") || sluice::sleep(2s)); });
  CHECK(svc.cancellations() == 1);
  CHECK(svc.in_flight() == 0);
  CHECK(svc.in_flight("k") == 0);
  CHECK(svc.timeline()[0].result == call_result::cancelled);
  CHECK(svc.timeline()[0].end == 2s);
}

TEST_CASE("bad models are rejected with invalid_argument", "[slow_service]") {
  CHECK_THROWS_AS(latency::uniform(5s, 1s), std::invalid_argument);
  CHECK_THROWS_AS(latency::sequence({}), std::invalid_argument);
  CHECK_THROWS_AS(failures::probability(1.5), std::invalid_argument);
  CHECK_THROWS_AS(slow_service({.time_scale = 0.0}), std::invalid_argument);
}

TEST_CASE("the time scale shrinks latencies for real-time demos", "[slow_service]") {
  slow_service svc({.latency = latency::fixed(10s), .time_scale = 0.01});
  virtual_loop loop;
  loop.run(svc.call());
  CHECK(loop.now() == 100ms);
}

TEST_CASE("a latency model that throws fails the call and leaves nothing in flight",
          "[slow_service]") {
  slow_service svc({.latency = [](const call_info& c) -> std::chrono::nanoseconds {
    if (c.index == 1) throw std::domain_error("no latency for call 1");
    return 1s;
  }});
  virtual_loop loop;
  loop.run(svc.call());
  CHECK_THROWS_AS(loop.run(svc.call("k")), std::domain_error);
  CHECK(svc.in_flight() == 0);
  CHECK(svc.in_flight("k") == 0);
  loop.run(svc.call("k"));
  CHECK(svc.max_in_flight("k") == 1);
  CHECK(svc.collisions() == 0);
  CHECK(svc.calls() == 3);
  CHECK(svc.completed() == 2);
}

TEST_CASE("a capacity schedule throttles calls past the capacity in force at their start",
          "[slow_service]") {
  slow_service svc({.latency = latency::fixed(10s), .capacity = {{0s, 2}, {5s, 1}, {20s, 3}}});
  CHECK(svc.capacity_at(0s) == 2);
  CHECK(svc.capacity_at(4999ms) == 2);
  CHECK(svc.capacity_at(5s) == 1);
  CHECK(svc.capacity_at(1h) == 3);
  virtual_loop loop;
  std::vector<std::string> outcome;
  auto attempt = [&](std::chrono::nanoseconds at) -> asio::awaitable<void> {
    co_await sluice::sleep(at);
    try {
      co_await svc.call();
      outcome.push_back("ok");
    } catch (const throttled_error& e) {
      CHECK(std::string(e.what()).find("capacity") != std::string::npos);
      outcome.push_back("429");
    }
  };
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    // 0 s: two run, a third is over 2. 6 s: two still in flight, over 1.
    // 20 s: none in flight, capacity 3: three run, the fourth is refused.
    co_await (attempt(0s) && attempt(0s) && attempt(0s) && attempt(6s) && attempt(20s) &&
              attempt(20s) && attempt(20s) && attempt(20s));
  });
  CHECK(std::count(outcome.begin(), outcome.end(), "429") == 3);
  CHECK(svc.throttles() == 3);
  CHECK(svc.max_in_flight() == 3);
  CHECK(loop.now() == 30s);
}

TEST_CASE("latency grows with the calls already in flight relative to the capacity",
          "[slow_service]") {
  slow_service svc({.latency = latency::fixed(1s), .capacity = {{0s, 4}}, .load_latency = 2.0});
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    co_await (svc.call() && svc.call() && svc.call() && svc.call());
  });
  // Started in turn at 0 s with 0, 1, 2, 3 in flight: 1 s x (1 + 2 n / 4).
  REQUIRE(svc.timeline().size() == 4);
  CHECK(svc.timeline()[0].end == 1s);
  CHECK(svc.timeline()[1].end == 1500ms);
  CHECK(svc.timeline()[2].end == 2s);
  CHECK(svc.timeline()[3].end == 2500ms);
  CHECK(loop.now() == 2500ms);
}

TEST_CASE("a bad capacity schedule or load_latency is rejected", "[slow_service]") {
  CHECK_THROWS_AS(slow_service({.capacity = {{0s, 0}}}), std::invalid_argument);
  CHECK_THROWS_AS(slow_service({.capacity = {{5s, 2}, {5s, 3}}}), std::invalid_argument);
  CHECK_THROWS_AS(slow_service({.load_latency = -1}), std::invalid_argument);
}

namespace {
// The Retry-After hint of the throttle `r` holds.
sluice::clock::duration hint_of(const sluice::outcome<void>& r) {
  const auto* t = r.error_as<throttled_error>();
  REQUIRE(t != nullptr);
  return t->after;
}
}  // namespace

TEST_CASE("a throttle by a window quota carries the time until the window admits the call",
          "[slow_service]") {
  slow_service svc(
      {.latency = latency::fixed(1s), .quota = {.calls_per_window = 2, .window = 10s}});
  virtual_loop loop;
  std::vector<sluice::outcome<void>> r;
  loop.run([&]() -> asio::awaitable<void> {
    r = co_await sluice::gather(calls(svc, std::vector<std::string>(2)),
                                sluice::return_exceptions);  // 0 .. 1 s
    co_await sluice::sleep(2s);                              // t = 3 s
    auto more =
        co_await sluice::gather(calls(svc, std::vector<std::string>(2)), sluice::return_exceptions);
    r.insert(r.end(), more.begin(), more.end());
  });
  CHECK(hint_of(r[2]) == 7s);  // the first start (0 s) leaves the window at 10 s
  CHECK(hint_of(r[3]) == 7s);
  CHECK(sluice::retryable(r[2].error()));
}

TEST_CASE("a throttle by an in-flight quota carries the time until the first call in flight ends",
          "[slow_service]") {
  slow_service svc({.latency = latency::sequence({5s, 3s, 1s}), .quota = {.max_in_flight = 2}});
  slow_service keyed(
      {.latency = latency::sequence({5s, 3s, 1s}), .key_quota = {.max_in_flight = 1}});
  virtual_loop loop;
  auto r =
      loop.run(sluice::gather(calls(svc, std::vector<std::string>(3)), sluice::return_exceptions));
  CHECK(hint_of(r[2]) == 3s);
  auto k = loop.run(sluice::gather(calls(keyed, {"a", "b", "a"}), sluice::return_exceptions));
  CHECK(hint_of(k[2]) == 5s);  // a's call, not b's shorter one
}

TEST_CASE("a tokens-per-window quota weighs each call; the hint says when enough tokens leave",
          "[slow_service]") {
  slow_service svc(
      {.latency = latency::fixed(1s), .quota = {.window = 1min, .tokens_per_window = 1000}});
  virtual_loop loop;
  std::vector<sluice::outcome<void>> r;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> first;
    first.push_back(svc.call("", "", 400));  // t = 0
    first.push_back(svc.call("", "", 500));  // t = 0
    r = co_await sluice::gather(std::move(first), sluice::return_exceptions);
    co_await sluice::sleep(9s);  // t = 10 s
    std::vector<asio::awaitable<void>> second;
    second.push_back(svc.call("", "", 400));  // 400 + 500 + 400 > 1000 until 60 s
    second.push_back(svc.call("", "", 100));  // fits: 1000 exactly
    auto more = co_await sluice::gather(std::move(second), sluice::return_exceptions);
    r.insert(r.end(), more.begin(), more.end());
    co_await sluice::sleep(49s);     // t = 60 s
    co_await svc.call("", "", 400);  // the 400 and the 500 left the window
  });
  CHECK(r[0]);
  CHECK(r[1]);
  CHECK(hint_of(r[2]) == 50s);
  CHECK(r[3]);
  CHECK(svc.throttles() == 1);
  CHECK(svc.completed() == 4);
  CHECK(svc.timeline()[2].tokens == 400);
  CHECK(svc.timeline()[3].tokens == 100);
}

TEST_CASE("a call heavier than the whole token quota fails; it could never be admitted",
          "[slow_service]") {
  slow_service svc(
      {.latency = latency::fixed(1s), .quota = {.window = 1min, .tokens_per_window = 1000}});
  virtual_loop loop;
  CHECK_THROWS_AS(loop.run(svc.call("", "", 1001)), service_error);
  CHECK_FALSE(sluice::retryable(std::make_exception_ptr(service_error("x", 0, ""))));
  CHECK(svc.failures() == 1);
  CHECK(svc.throttles() == 0);
  CHECK(svc.in_flight() == 0);
}

TEST_CASE("the calls and tokens quotas of one window both apply", "[slow_service]") {
  slow_service svc({.latency = latency::fixed(1s),
                    .quota = {.calls_per_window = 3, .window = 1min, .tokens_per_window = 100}});
  virtual_loop loop;
  std::vector<asio::awaitable<void>> c;
  c.push_back(svc.call("", "", 10));
  c.push_back(svc.call("", "", 10));
  c.push_back(svc.call("", "", 90));  // tokens: throttled
  c.push_back(svc.call("", "", 10));
  c.push_back(svc.call("", "", 10));  // calls: throttled
  auto r = loop.run(sluice::gather(std::move(c), sluice::return_exceptions));
  CHECK(hint_of(r[2]) == 1min);
  CHECK(r[3]);
  CHECK(hint_of(r[4]) == 1min);
  CHECK(svc.completed() == 3);
}

TEST_CASE("a latency model sees the key as a string_view and returns sluice::clock::duration",
          "[slow_service]") {
  // The types the harness docs name (docs/testing.md, call_info).
  STATIC_REQUIRE(std::is_same_v<decltype(call_info::key), std::string_view>);
  STATIC_REQUIRE(std::is_same_v<std::invoke_result_t<latency_model, const call_info&>,
                                sluice::clock::duration>);
  std::vector<std::string> keys;
  slow_service svc({.latency = latency::from([&](const call_info& c) -> sluice::clock::duration {
                      keys.emplace_back(c.key);  // a view: copied to keep it
                      return c.key == "slow" ? 5s : 1s;
                    })});
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    std::string k = "slow";
    co_await svc.call(k);
    k = "fast";
    co_await svc.call(k);
  }());
  CHECK(loop.now() == 6s);
  CHECK(keys == std::vector<std::string>{"slow", "fast"});
}

TEST_CASE("quota windows, capacity steps and uniform bounds take any duration, saturated",
          "[slow_service]") {
  // hours::max() in nanoseconds overflows: the window wrapped negative (no
  // call ever counted in it) and the step time wrapped before the first one.
  slow_service svc({.latency = latency::uniform(1s, std::chrono::hours::max()),
                    .quota = {.calls_per_window = 1, .window = std::chrono::hours::max()},
                    .capacity = {{0s, 5}, {std::chrono::hours::max(), 1}}});
  CHECK(svc.capacity_at(0s) == 5);
  CHECK(svc.capacity_at(std::chrono::hours(24 * 365 * 100)) == 5);  // the last step never comes
  slow_service quick({.latency = latency::fixed(1s),
                      .quota = {.calls_per_window = 1, .window = std::chrono::hours::max()}});
  virtual_loop loop;
  std::vector<sluice::outcome<void>> r;
  loop.run([&]() -> asio::awaitable<void> {
    r = co_await sluice::gather(calls(quick, std::vector<std::string>(1)),
                                sluice::return_exceptions);
    co_await sluice::sleep(std::chrono::hours(24 * 365));  // a year later: still in the window
    auto more = co_await sluice::gather(calls(quick, std::vector<std::string>(1)),
                                        sluice::return_exceptions);
    r.insert(r.end(), more.begin(), more.end());
  });
  REQUIRE(r.size() == 2);
  CHECK(r[0].has_value());
  CHECK_FALSE(r[1].has_value());
  CHECK(quick.throttles() == 1);
}
