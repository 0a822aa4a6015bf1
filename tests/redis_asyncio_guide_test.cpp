// SPDX-License-Identifier: BSL-1.0
// The Redis snippet of docs/asyncio.md ("From asyncio to sluice"): a limit
// shared by every process of a fleet, against a real redis-server in real
// time (a virtual_loop cannot drive a socket). Built only with the redis
// component; skipped (77) when no redis-server can be started. Its cpp block
// is checked against this file by asyncio_guide_test.
#include <sluice/redis/rate_limiter.hpp>
#include <sluice/redis/semaphore.hpp>

#include <support/asio.hpp>
#include <support/redis_run.hpp>
#include <support/redis_server.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>

using namespace std::chrono_literals;

TEST_CASE("guide: a Redis semaphore and rate limiter shared by the fleet", "[asyncio_guide]") {
  const auto port = static_cast<std::uint16_t>(sluice_test::shared_redis_server().port());
  asio::io_context ctx;
  std::size_t held = 0, free_while_held = 0, free_after = 0;
  sluice_test::run_for(ctx, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto conn = co_await sluice::redis::connect(ex, "127.0.0.1", port);
    sluice::redis::semaphore cap{conn, "guide-api", 2, 2s};  // 2 across the fleet, 2 s lease
    sluice::redis::rate_limiter rpm{conn, "guide-api:rpm", 60, 1min};  // 60 starts a minute
    {
      auto permit = co_await cap.scoped_acquire();  // a permit shared by every process
      co_await rpm.acquire();                       // a start inside the fleet's quota
      held = cap.held();
      free_while_held = co_await cap.value();
    }
    free_after = co_await cap.value();
    co_await cap.close();  // stops lease renewal, releases what is still held
    co_await conn->close();
  }());
  CHECK(held == 1);
  CHECK(free_while_held == 1);
  CHECK(free_after == 2);
}
