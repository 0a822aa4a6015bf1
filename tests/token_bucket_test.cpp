// SPDX-License-Identifier: BSL-1.0
// sluice::token_bucket: the smoothing limiter, and when it is the wrong one
// (DESIGN.md "Beyond asyncio", semantics 3). Exact, in virtual time.
#include <sluice/token_bucket.hpp>

#include <sluice/gather.hpp>
#include <sluice/rate_limiter.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/fresh_loop.hpp>
#include <support/spawned.hpp>

#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::call_result;
using sluice::testing::slow_service;
using sluice::testing::virtual_loop;
using sluice_test::tasks_on_loop;
namespace latency = sluice::testing::latency;

namespace {

// 200 calls, each gated by `limiter`, against a provider that allows 60 starts
// in any minute. Settling: a throttled call is counted, not retried.
template <class Limiter>
void run_200(slow_service& svc, Limiter& limiter) {
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> calls;
    for (int i = 0; i < 200; ++i) {
      calls.push_back([](Limiter& l, slow_service& s) -> asio::awaitable<void> {
        co_await l.acquire();
        co_await s.call();
      }(limiter, svc));
    }
    (void)co_await sluice::gather(std::move(calls), sluice::return_exceptions);
  });
}

slow_service::options per_minute_provider() {
  return {.latency = latency::uniform(1s, 5s, 7),
          .quota = {.calls_per_window = 60, .window = 1min}};
}

}  // namespace

TEST_CASE(
    "token_bucket 1 per second with burst 60 is throttled by a 60-per-minute provider "
    "from 1 s to 59 s",
    "[token_bucket]") {
  // The bucket lets 60 start at 0 s and then one per second; the provider's
  // rolling window still holds all 60 of 0 s until 60 s.
  slow_service svc(per_minute_provider());
  sluice::token_bucket tb{1.0, 60};
  run_200(svc, tb);
  std::vector<std::chrono::nanoseconds> throttled;
  for (const auto& r : svc.timeline())
    if (r.result == call_result::throttled) throttled.push_back(r.start);
  REQUIRE(svc.throttles() == 59);
  CHECK(throttled.front() == 1s);
  CHECK(throttled.back() == 59s);
  for (std::size_t i = 0; i < throttled.size(); ++i)
    CHECK(throttled[i] == std::chrono::seconds(i + 1));
  CHECK(svc.timeline().back().start == 140s);  // one start per second after the burst
}

TEST_CASE(
    "token_bucket 1 per second with burst 1 is safe against the same provider but slower "
    "than rate_limiter",
    "[token_bucket]") {
  slow_service smooth(per_minute_provider());
  sluice::token_bucket tb{1.0, 1};
  run_200(smooth, tb);
  CHECK(smooth.throttles() == 0);
  CHECK(smooth.timeline().back().start == 199s);

  slow_service windowed(per_minute_provider());
  sluice::rate_limiter rl{60, 1min};
  run_200(windowed, rl);
  CHECK(windowed.throttles() == 0);
  CHECK(windowed.timeline().back().start == 180s);
}

TEST_CASE("a token_bucket starts full and refills at its rate", "[token_bucket]") {
  tasks_on_loop h;
  sluice::token_bucket tb{h.loop.get_executor(), 2.0, 4};  // one token per 500 ms
  CHECK(tb.tokens() == 4.0);
  CHECK(tb.try_acquire(4));
  CHECK_FALSE(tb.try_acquire());
  CHECK(tb.tokens() == 0.0);
  h.loop.run_for(250ms);
  CHECK(tb.tokens() == 0.5);
  h.loop.run_for(250ms);
  CHECK(tb.try_acquire());
  h.loop.run_for(10s);
  CHECK(tb.tokens() == 4.0);  // never above burst
}

TEST_CASE("token_bucket tokens() is exact for a rate that divides 10^9", "[token_bucket]") {
  tasks_on_loop h;
  h.loop.run_for(1s);
  sluice::token_bucket tb{h.loop.get_executor(), 10.0, 3};  // one token per 100 ms
  CHECK(tb.try_acquire(3));
  CHECK(tb.tokens() == 0.0);  // not 4.4e-16
  h.loop.run_for(100ms);
  CHECK(tb.tokens() == 1.0);
  h.loop.run_for(50ms);
  CHECK(tb.tokens() == 1.5);
  CHECK(tb.try_acquire(1));
  CHECK(tb.tokens() == 0.5);
}

TEST_CASE("a token_bucket serves one io_context after another", "[token_bucket][lifetime]") {
  sluice::token_bucket tb{50.0, 1};  // one token per 20 ms
  for (int round = 0; round < 2; ++round) {
    CHECK(sluice_test::run_on_fresh_loop([&]() -> asio::awaitable<void> {
      co_await tb.acquire();
      co_await tb.acquire();
    }));
  }
}

TEST_CASE("token_bucket waiters are FIFO with mixed n and go exactly when their tokens are there",
          "[token_bucket]") {
  tasks_on_loop h;
  sluice::token_bucket tb{h.loop.get_executor(), 1.0, 5};
  REQUIRE(tb.try_acquire(5));
  std::vector<std::string> order;
  std::vector<std::chrono::nanoseconds> at;
  auto waiter = [&](std::string name, std::size_t n) -> sluice_test::task& {
    return h.spawn([&, name, n]() -> asio::awaitable<void> {
      co_await tb.acquire(n);
      order.push_back(name);
      at.push_back(h.loop.now());
    });
  };
  waiter("big", 4);    // 4 tokens: 4 s
  waiter("small", 1);  // then 1 more: 5 s (not 1 s: no barging)
  h.loop.run_for(10s);
  CHECK(order == std::vector<std::string>{"big", "small"});
  CHECK(at == std::vector<std::chrono::nanoseconds>{4s, 5s});
}

TEST_CASE("cancelling the head of a token_bucket lets the next waiter in at once",
          "[token_bucket]") {
  tasks_on_loop h;
  sluice::token_bucket tb{h.loop.get_executor(), 1.0, 5};
  REQUIRE(tb.try_acquire(4));                                                       // 1 left
  auto& big = h.spawn([&]() -> asio::awaitable<void> { co_await tb.acquire(5); });  // at 4 s
  std::chrono::nanoseconds small_at{-1};
  h.spawn([&]() -> asio::awaitable<void> {
    co_await tb.acquire(2);  // alone: at 1 s
    small_at = h.loop.now();
  });
  h.loop.run_for(500ms);
  big.cancel();
  h.loop.run_for(10s);
  CHECK(big.cancelled());
  CHECK(small_at == 1s);
}

TEST_CASE("a caller of a token_bucket cancelled before it called takes nothing", "[token_bucket]") {
  tasks_on_loop h;
  sluice::token_bucket tb{h.loop.get_executor(), 1.0, 3};
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      co_await sluice::sleep(1s);
    } catch (const sluice::system_error&) {
    }
    co_await tb.acquire(3);
  });
  h.poll();
  t.cancel();
  h.poll();
  CHECK(t.cancelled());
  CHECK(tb.tokens() == 3.0);
}

TEST_CASE("token_bucket bad input is rejected at once with invalid_argument", "[token_bucket]") {
  CHECK_THROWS_AS(sluice::token_bucket(0.0, 1), std::invalid_argument);
  CHECK_THROWS_AS(sluice::token_bucket(-1.0, 1), std::invalid_argument);
  CHECK_THROWS_AS(sluice::token_bucket(std::nan(""), 1), std::invalid_argument);
  CHECK_THROWS_AS(sluice::token_bucket(std::numeric_limits<double>::infinity(), 1),
                  std::invalid_argument);
  CHECK_THROWS_AS(sluice::token_bucket(1.0, 0), std::invalid_argument);
  virtual_loop loop;
  sluice::token_bucket tb{loop.get_executor(), 10.0, 20};
  CHECK_THROWS_AS((void)tb.acquire(21), std::invalid_argument);  // n > burst: not a hang
  CHECK_THROWS_AS((void)tb.acquire(0), std::invalid_argument);
  CHECK_THROWS_AS((void)tb.try_acquire(21), std::invalid_argument);
  CHECK_THROWS_AS(tb.async_acquire(21, [](sluice::error_code) {}), std::invalid_argument);
  CHECK(tb.try_acquire(20));
}

TEST_CASE("destroying a token_bucket with waiters aborts them", "[token_bucket]") {
  tasks_on_loop h;
  std::vector<sluice_test::task*> t;
  {
    sluice::token_bucket tb{h.loop.get_executor(), 0.001, 1};
    REQUIRE(tb.try_acquire());
    for (int i = 0; i < 2; ++i)
      t.push_back(&h.spawn([&]() -> asio::awaitable<void> { co_await tb.acquire(); }));
    h.poll();
    CHECK(tb.waiters() == 2);
  }
  h.poll();
  for (auto* x : t) CHECK(x->cancelled());
}

TEST_CASE("a give-back refunds only the tokens its grant took that have not refilled",
          "[token_bucket]") {
  // The give-back acquire_all makes (and a grant cancelled before it
  // resumed): keyed by what rate_core returned for the grant.
  virtual_loop loop;
  sluice::token_bucket tb{loop.get_executor(), 1.0, 2};  // one token a second, burst 2
  auto& core = sluice::detail::rate_access::core(tb);
  loop.run([&]() -> asio::awaitable<void> {
    const auto ex = co_await asio::this_coro::executor;
    // At once: the whole grant comes back.
    auto key = core.take_ready(1, ex);
    CHECK(tb.tokens() == 1.0);
    core.give_back(1, key);
    CHECK(tb.tokens() == 2.0);
    // After the bucket refilled: nothing to refund.
    key = core.take_ready(1, ex);  // t 0
    co_await sluice::sleep(1s);
    CHECK(tb.tokens() == 2.0);  // its token is back already
    co_await tb.acquire(2);     // t 1: empty
    core.give_back(1, key);
    CHECK(tb.tokens() == 0.0);  // was 1.0: a token that was never lost
    CHECK_FALSE(tb.try_acquire());
    // Half refilled: half a token comes back, as if the grant had never been.
    co_await sluice::sleep(2s);  // t 3: full
    key = core.take_ready(1, ex);
    co_await sluice::sleep(500ms);
    co_await tb.acquire(1);  // t 3.5: 0.5 left
    core.give_back(1, key);
    CHECK(tb.tokens() == 1.0);  // as the second grant alone leaves it (was 1.5)
  });
  CHECK(loop.now() == 3500ms);
}

TEST_CASE("token_bucket and rate_limiter take their counts as any integer type", "[token_bucket]") {
  int burst = 4, calls = 3, negative = -2;
  sluice::token_bucket tb{1.0, burst};
  CHECK(tb.burst() == 4);
  sluice::rate_limiter rl{calls, 1s};
  CHECK(rl.calls() == 3);
  virtual_loop loop;
  sluice::token_bucket tb2{loop.get_executor(), 1.0, burst};
  sluice::rate_limiter rl2{loop.get_executor(), calls, 1s};
  CHECK(tb2.burst() == 4);
  CHECK(rl2.calls() == 3);
  CHECK_THROWS_WITH(sluice::token_bucket(1.0, negative),
                    "sluice::token_bucket: burst must not be negative");
  CHECK_THROWS_WITH(sluice::rate_limiter(negative, 1s),
                    "sluice::rate_limiter: calls must not be negative");
}
