// SPDX-License-Identifier: BSL-1.0
// sluice::keyed_rate_limiter: one sliding window per key, idle keys freed.
#include <sluice/keyed_rate_limiter.hpp>

#include <sluice/gather.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/fresh_loop.hpp>
#include <support/spawned.hpp>

#include <chrono>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::virtual_loop;
using sluice_test::tasks_on_loop;

TEST_CASE("a busy key never delays another key", "[keyed_rate_limiter]") {
  virtual_loop loop;
  sluice::keyed_rate_limiter<std::string> per_key{2, 10s};
  std::map<std::string, std::vector<std::chrono::nanoseconds>> at;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> callers;
    for (std::string key : {"a", "a", "a", "a", "a", "b", "b", "c"}) {
      callers.push_back(
          [](std::string k, auto& limiter, auto& out, virtual_loop& l) -> asio::awaitable<void> {
            co_await limiter.acquire(k);
            out[k].push_back(l.now());
          }(key, per_key, at, loop));
    }
    co_await sluice::gather(std::move(callers));
  });
  CHECK(at["a"] == std::vector<std::chrono::nanoseconds>{0s, 0s, 10s, 10s, 20s});
  CHECK(at["b"] == std::vector<std::chrono::nanoseconds>{0s, 0s});
  CHECK(at["c"] == std::vector<std::chrono::nanoseconds>{0s});
}

TEST_CASE("idle keys are freed exactly when their window empties", "[keyed_rate_limiter]") {
  tasks_on_loop h;
  sluice::keyed_rate_limiter<int> per_key{h.loop.get_executor(), 3, 10s};
  CHECK(per_key.try_acquire(1));
  CHECK(per_key.try_acquire(2, 3));
  h.loop.run_for(4s);
  CHECK(per_key.try_acquire(3));
  CHECK(per_key.keys() == 3);
  h.loop.run_for(6s - 1ns);
  CHECK(per_key.keys() == 3);
  h.loop.run_for(1ns);  // 10 s: the windows of keys 1 and 2 are empty
  CHECK(per_key.keys() == 1);
  h.loop.run_for(4s);  // 14 s: key 3's too
  CHECK(per_key.keys() == 0);
  // A freed key starts over with a full quota.
  CHECK(per_key.try_acquire(2, 3));
  CHECK_FALSE(per_key.try_acquire(2));
}

TEST_CASE("a start exactly one window ago has left it: the key is freed and a new start is granted",
          "[keyed_rate_limiter]") {
  // The window is half-open, (now - per, now]: the boundary instant is out,
  // for the grant and for freeing the key alike (and neither hangs).
  tasks_on_loop h;
  sluice::keyed_rate_limiter<int> per_key{h.loop.get_executor(), 1, 1s};
  CHECK(per_key.try_acquire(7));
  h.loop.run_for(1s - 1ns);
  CHECK(per_key.keys() == 1);
  CHECK_FALSE(per_key.try_acquire(7));
  h.loop.run_for(1ns);
  CHECK(per_key.keys() == 0);
  CHECK(per_key.try_acquire(7));
  CHECK(per_key.keys() == 1);
}

TEST_CASE("ten thousand distinct keys leave nothing behind once their windows empty",
          "[keyed_rate_limiter]") {
  tasks_on_loop h;
  sluice::keyed_rate_limiter<int> per_key{h.loop.get_executor(), 1, 1s};
  for (int k = 0; k < 10000; ++k) {
    REQUIRE(per_key.try_acquire(k));
    if (k % 100 == 99) h.loop.run_for(10ms);
  }
  CHECK(per_key.keys() > 0);
  h.loop.run_for(1s);
  CHECK(per_key.keys() == 0);
}

TEST_CASE("a key with waiters is kept, and freed once they are done and its window empties",
          "[keyed_rate_limiter]") {
  tasks_on_loop h;
  sluice::keyed_rate_limiter<std::string> per_key{h.loop.get_executor(), 1, 10s};
  REQUIRE(per_key.try_acquire("a"));
  auto& w = h.spawn([&]() -> asio::awaitable<void> { co_await per_key.acquire("a"); });
  h.loop.run_for(5s);
  CHECK(per_key.waiters("a") == 1);
  CHECK(per_key.keys() == 1);
  h.loop.run_for(5s);  // granted at 10 s
  CHECK(w.succeeded());
  CHECK(per_key.keys() == 1);
  h.loop.run_for(10s);
  CHECK(per_key.keys() == 0);
}

TEST_CASE("cancelling the head waiter of a key lets the next in without touching other keys",
          "[keyed_rate_limiter]") {
  tasks_on_loop h;
  sluice::keyed_rate_limiter<std::string> per_key{h.loop.get_executor(), 3, 10s};
  REQUIRE(per_key.try_acquire("a", 2));
  REQUIRE(per_key.try_acquire("b", 3));
  auto& big = h.spawn([&]() -> asio::awaitable<void> { co_await per_key.acquire("a", 3); });
  std::chrono::nanoseconds small_at{-1};
  auto& small = h.spawn([&]() -> asio::awaitable<void> {
    co_await per_key.acquire("a");
    small_at = h.loop.now();
  });
  auto& other = h.spawn([&]() -> asio::awaitable<void> { co_await per_key.acquire("b"); });
  h.loop.run_for(1s);
  big.cancel();
  h.poll();
  CHECK(big.cancelled());
  CHECK(small.succeeded());
  CHECK(small_at == 1s);
  CHECK_FALSE(other.done);  // b's window is still full
  h.loop.run_for(9s);
  CHECK(other.succeeded());
}

TEST_CASE("keyed_rate_limiter bad input is rejected at once", "[keyed_rate_limiter]") {
  using limiter = sluice::keyed_rate_limiter<std::string>;
  CHECK_THROWS_AS(limiter(0, 1s), std::invalid_argument);
  CHECK_THROWS_AS(limiter(1, 0s), std::invalid_argument);
  virtual_loop loop;
  limiter per_key{loop.get_executor(), 5, 1s};
  CHECK_THROWS_AS((void)per_key.acquire("a", 6), std::invalid_argument);
  CHECK_THROWS_AS((void)per_key.acquire("a", 0), std::invalid_argument);
  CHECK_THROWS_AS((void)per_key.try_acquire("a", 6), std::invalid_argument);
  CHECK(per_key.keys() == 0);
}

TEST_CASE("destroying a keyed_rate_limiter with waiters aborts them", "[keyed_rate_limiter]") {
  tasks_on_loop h;
  std::vector<sluice_test::task*> t;
  {
    sluice::keyed_rate_limiter<std::string> per_key{h.loop.get_executor(), 1, 1h};
    REQUIRE(per_key.try_acquire("a"));
    REQUIRE(per_key.try_acquire("b"));
    for (std::string k : {"a", "b", "a"})
      t.push_back(&h.spawn([&, k]() -> asio::awaitable<void> { co_await per_key.acquire(k); }));
    h.poll();
    CHECK(per_key.waiters("a") == 2);
  }
  h.poll();
  for (auto* x : t) CHECK(x->cancelled());
}

TEST_CASE("a keyed_rate_limiter of one call per nanoseconds::max() admits one call per key, ever",
          "[keyed_rate_limiter]") {
  tasks_on_loop h;
  sluice::keyed_rate_limiter<int> once{h.loop.get_executor(), 1, std::chrono::nanoseconds::max()};
  h.loop.run_for(1s);
  CHECK(once.try_acquire(1));
  h.loop.run_for(1h);
  CHECK_FALSE(once.try_acquire(1));
  CHECK(once.try_acquire(2));
  CHECK(once.keys() == 2);
}

TEST_CASE("a keyed_rate_limiter of SIZE_MAX calls never wraps its count", "[keyed_rate_limiter]") {
  tasks_on_loop h;
  const std::size_t most = std::numeric_limits<std::size_t>::max();
  sluice::keyed_rate_limiter<int> per_key{h.loop.get_executor(), most, 1s};
  CHECK(per_key.try_acquire(7, most));
  CHECK_FALSE(per_key.try_acquire(7, 1));
  CHECK(per_key.try_acquire(8, 1));
  h.loop.run_for(1s);
  CHECK(per_key.try_acquire(7, 1));
}

TEST_CASE("a keyed_rate_limiter serves one io_context after another",
          "[keyed_rate_limiter][lifetime]") {
  sluice::keyed_rate_limiter<int> per_key{1, 20ms};
  for (int round = 0; round < 2; ++round) {
    CHECK(sluice_test::run_on_fresh_loop([&]() -> asio::awaitable<void> {
      co_await per_key.acquire(1);
      co_await per_key.acquire(1);
    }));
  }
}
