// SPDX-License-Identifier: BSL-1.0
// The snippets of docs/redis.md, against a real redis-server in real time (a
// virtual_loop cannot drive a socket). Built only with the redis component;
// skipped (77) when no redis-server can be started. ctest's docs_check
// (tests/docs/check_docs.py) checks that each ```cpp block of the page is in
// this file line for line.
// clang-format off
#include <sluice/redis/rate_limiter.hpp>
#include <sluice/redis/semaphore.hpp>
// clang-format on

#include <support/asio.hpp>
#include <support/redis_run.hpp>
#include <support/redis_server.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

TEST_CASE("redis.md: a fleet-wide semaphore and rate limiter around the call", "[docs]") {
  const auto port = static_cast<std::uint16_t>(sluice_test::shared_redis_server().port());
  asio::io_context ctx;
  std::size_t calls = 0, held_during_call = 0, free_during_call = 0, free_after = 0;
  sluice_test::run_for(ctx, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    sluice::redis::semaphore* cap_seen = nullptr;
    auto call_places_api = [&]() -> asio::awaitable<void> {
      ++calls;
      held_during_call = cap_seen->held();
      free_during_call = co_await cap_seen->value();
    };
    // clang-format off
auto conn = co_await sluice::redis::connect(ex, "127.0.0.1", port);   // or connect_unix(ex, path)
sluice::redis::semaphore cap{conn, "places-api", 5, std::chrono::seconds(5)};   // 5 s lease
sluice::redis::rate_limiter rpm{conn, "places-api:rpm", 60, std::chrono::minutes(1)};
    // clang-format on
    cap_seen = &cap;
    // clang-format off
{
  auto permit = co_await cap.scoped_acquire();   // at most 5 across every process
  co_await rpm.acquire();                        // at most 60 starts per minute, fleet-wide
  co_await call_places_api();
}
    // clang-format on
    free_after = co_await cap.value();
    co_await cap.close();  // stops lease renewal, releases what is still held
    co_await conn->close();
  }());
  CHECK(calls == 1);
  CHECK(held_during_call == 1);
  CHECK(free_during_call == 4);
  CHECK(free_after == 5);
}

TEST_CASE("redis.md: production options, run() with a fencing token", "[docs]") {
  auto server = sluice_test::server_or_skip({}, {"--requirepass", "s3cret"});
  const auto port = static_cast<std::uint16_t>(server.port());
  asio::io_context ctx;
  std::int64_t seen_token = 0;
  std::string db;
  sluice_test::run_for(ctx, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto call_places_api = [&](std::int64_t token) -> asio::awaitable<void> {
      seen_token = token;
      co_return;
    };
    // clang-format off
sluice::redis::options o;
o.port = port;
o.password = "s3cret";                         // AUTH (set o.user too for an ACL user)
o.db = 2;                                      // SELECT
o.command_timeout = std::chrono::seconds(1);   // a silent server fails calls after 1 s
auto conn = co_await sluice::redis::connect(ex, o);
sluice::redis::semaphore cap{conn, "places-api", 5, std::chrono::seconds(5)};
co_await cap.run([&](std::int64_t fencing_token) -> asio::awaitable<void> {
  co_await call_places_api(fencing_token);     // cancelled if the lease stops being certain
});
    // clang-format on
    CHECK(cap.held() == 0);
    db = (co_await conn->execute("CLIENT", "INFO")).str;
    co_await cap.close();
    co_await conn->close();
  }());
  CHECK(seen_token > 0);
  CHECK(db.find(" db=2 ") != std::string::npos);
}
