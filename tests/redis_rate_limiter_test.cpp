// SPDX-License-Identifier: BSL-1.0
// sluice::redis::rate_limiter against a real redis-server, with several processes.
#include <sluice/redis/rate_limiter.hpp>

#include <sluice/stats.hpp>

#include <support/asio.hpp>
#include <support/redis_run.hpp>
#include <support/redis_server.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice::redis::reply;
using sluice_test::connect_to;
using sluice_test::run_for;
using sluice_test::sleep_ms;

namespace {

// One server for the whole binary (a restart test starts its own).
using sluice_test::shared_redis_server;

// Child: 2 coroutines x `n` acquisitions of a shared limiter of 20 per 2 s;
// records each start's server time in the list "starts".
const sluice_test::register_child limited_worker{
    "limited_worker", [](const std::vector<std::string>& a) {
      asio::io_context ctx;
      run_for(
          ctx,
          [&]() -> asio::awaitable<void> {
            auto conn = co_await connect_to(std::stoi(a.at(0)));
            sluice::redis::rate_limiter rl{conn, "shared", 20, 2s};
            const int n = std::stoi(a.at(1));
            int done = 0;
            auto one = [&]() -> asio::awaitable<void> {
              for (int i = 0; i < n; ++i) {
                co_await rl.acquire();
                const long long t = co_await sluice_test::server_time_us(*conn);
                co_await conn->execute("RPUSH", "starts", std::to_string(t));
              }
              ++done;
            };
            auto ex = co_await asio::this_coro::executor;
            for (int c = 0; c < 2; ++c) asio::co_spawn(ex, one(), asio::detached);
            while (done < 2) co_await sleep_ms(10);
            co_await conn->close();
          }(),
          40s);
      return 0;
    }};

}  // namespace

TEST_CASE("3 processes sharing 20 calls per 2 s never start more than 20 in any 2 s window",
          "[redis_rate_limiter]") {
  const int port = shared_redis_server().port();
  std::vector<pid_t> pids;
  for (int p = 0; p < 3; ++p) {
    pids.push_back(sluice_test::spawn_child("limited_worker", {std::to_string(port), "8"}));
  }
  for (pid_t pid : pids) CHECK(sluice_test::wait_process(pid) == 0);
  asio::io_context ctx;
  std::vector<long long> starts;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(port);
    reply r = co_await conn->execute("LRANGE", "starts", "0", "-1");
    for (auto& e : r.elements) starts.push_back(std::stoll(e.str));
    co_await conn->close();
  }());
  REQUIRE(starts.size() == 48);
  std::sort(starts.begin(), starts.end());
  // A start is recorded a round trip after its grant: a window shorter by
  // 200 ms absorbs that delay (also on a loaded machine) and still catches an
  // over-admitting limiter (a per-process one lets 60 through at once).
  std::size_t worst = 0;
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const auto end = std::lower_bound(starts.begin(), starts.end(), starts[i] + 1800000);
    worst = std::max(worst, static_cast<std::size_t>(end - (starts.begin() + i)));
  }
  CHECK(worst <= 20);
  CHECK(worst >= 19);  // and the window was used
  // 48 starts at 20 per 2 s need two full windows, and not much more.
  CHECK(starts.back() - starts.front() >= 4000000 - 100000);
  CHECK(starts.back() - starts.front() <= 4000000 + 3000000);
}

TEST_CASE("the call over the limit waits until the oldest start leaves the window",
          "[redis_rate_limiter]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(port);
    sluice::redis::rate_limiter rl{conn, "exact", 5, 500ms};
    const long long t0 = co_await sluice_test::server_time_us(*conn);
    for (int i = 0; i < 5; ++i) co_await rl.acquire();
    const bool full = co_await rl.try_acquire();
    CHECK_FALSE(full);
    co_await rl.acquire();  // the sixth
    const long long t6 = co_await sluice_test::server_time_us(*conn);
    CHECK(t6 - t0 >= 500000);
    CHECK(t6 - t0 <= 500000 + 150000);
    reply window = co_await conn->execute("ZCARD", rl.key());
    CHECK(window.integer <= 5);  // the first start left (maybe more), the sixth came in
    CHECK(window.integer >= 1);
    CHECK_THROWS_AS(rl.acquire(6), std::invalid_argument);
    CHECK_THROWS_AS(rl.acquire(0), std::invalid_argument);
    co_await conn->close();
  }());
}

TEST_CASE("value() counts the fleet's starts still in the window, not the untrimmed ones",
          "[redis_rate_limiter]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto a = co_await connect_to(port);
    auto b = co_await connect_to(port);  // another process's limiter of the same name
    sluice::redis::rate_limiter ra{a, "fleet-value", 5, 400ms};
    sluice::redis::rate_limiter rb{b, "fleet-value", 5, 400ms};
    CHECK(co_await ra.value() == 5);
    co_await ra.acquire(2);
    co_await rb.acquire();
    CHECK(co_await ra.value() == 2);
    CHECK(co_await rb.value() == 2);
    co_await sleep_ms(450);  // all three left the window; nobody trimmed it
    CHECK((co_await a->execute("ZCARD", ra.key())).integer == 3);
    CHECK(co_await ra.value() == 5);
    co_await a->close();
    co_await b->close();
  }());
}

TEST_CASE("a cancelled rate_limiter waiter takes nothing", "[redis_rate_limiter]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(port);
    sluice::redis::rate_limiter rl{conn, "cancelled", 2, 1s};
    co_await rl.acquire(2);
    asio::cancellation_signal sig;
    sluice::error_code got = asio::error::would_block;
    rl.async_acquire(1,
                     sluice_test::bind_slot(sig.slot(), [&](sluice::error_code ec) { got = ec; }));
    co_await sleep_ms(50);
    CHECK(rl.waiters() == 1);
    sig.emit(asio::cancellation_type::terminal);
    for (int i = 0; i < 100 && got == asio::error::would_block; ++i) co_await sleep_ms(5);
    CHECK(got == asio::error::operation_aborted);
    CHECK(rl.waiters() == 0);
    reply window = co_await conn->execute("ZCARD", rl.key());
    CHECK(window.integer == 2);
    co_await conn->close();
  }());
  CHECK_THROWS_AS(sluice::redis::rate_limiter(nullptr, "x", 1, 1s), std::invalid_argument);
}

TEST_CASE("rate_limiter rejects limits above 2^53 and names that break the hash tag",
          "[redis_rate_limiter]") {
  const auto& server = sluice_test::shared_redis_server();
  asio::io_context ctx;
  auto conn = run_for(ctx, sluice_test::connect_to(server.port()));
  using rl = sluice::redis::rate_limiter;
  CHECK_THROWS_AS(rl(conn, "big", (std::size_t{1} << 53) + 1, std::chrono::seconds(1)),
                  std::invalid_argument);
  CHECK_THROWS_AS(rl(conn, "", 1, std::chrono::seconds(1)), std::invalid_argument);
  CHECK_THROWS_AS(rl(conn, "}{x", 1, std::chrono::seconds(1)), std::invalid_argument);
  CHECK_NOTHROW(rl(conn, "fine", 1, std::chrono::seconds(1)));
  run_for(ctx, conn->close());
}

namespace {

// Polls `cond` every 2 ms for up to 2 s.
asio::awaitable<void> until(const std::function<bool()>& cond) {
  for (int i = 0; i < 1000 && !cond(); ++i) co_await sleep_ms(2);
  if (!cond()) throw std::runtime_error("the condition never held");
}

}  // namespace

TEST_CASE("redis::rate_limiter stats count grants, throttles, waits and this client's window",
          "[redis_rate_limiter]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(port);
    sluice::redis::rate_limiter rl{conn, "stats-rl", 4, 400ms};
    sluice::stats s = rl.stats();
    CHECK(s.acquired == 0);
    CHECK(s.limit == 4);
    CHECK(s.in_use == 0);

    const auto t0 = std::chrono::steady_clock::now();
    co_await rl.acquire();
    co_await rl.acquire(2);  // counts once, 2 units
    const bool one_more = co_await rl.try_acquire();
    CHECK(one_more);
    const bool full = co_await rl.try_acquire();  // refused: throttled
    CHECK_FALSE(full);
    s = rl.stats();
    CHECK(s.acquired == 3);
    CHECK(s.throttled == 1);
    CHECK(s.in_use == 4);
    CHECK(s.wait.count == 3);
    CHECK(s.hold.count == 0);

    // A waiter cancelled while it sleeps: throttled and cancelled, takes nothing.
    asio::cancellation_signal sig;
    sluice::error_code cancelled_ec = asio::error::would_block;
    rl.async_acquire(
        1, sluice_test::bind_slot(sig.slot(), [&](sluice::error_code ec) { cancelled_ec = ec; }));
    co_await until([&] { return rl.stats().throttled == 2; });
    CHECK(rl.stats().waiting == 1);
    sig.emit(asio::cancellation_type::terminal);
    co_await until([&] { return cancelled_ec != asio::error::would_block; });
    CHECK(cancelled_ec == asio::error::operation_aborted);
    s = rl.stats();
    CHECK(s.cancelled == 1);
    CHECK(s.waiting == 0);
    CHECK(s.acquired == 3);

    // Over the limit: waits until the first start leaves the window (400 ms after t0).
    const auto t1 = std::chrono::steady_clock::now();
    co_await rl.acquire();
    const auto t2 = std::chrono::steady_clock::now();
    s = rl.stats();
    CHECK(s.acquired == 4);
    CHECK(s.throttled == 3);
    CHECK(s.wait.count == 4);
    CHECK(s.wait.max <= t2 - t1);
    CHECK(s.wait.max + 5ms >= t0 + 400ms - t1);  // 5 ms: the server's clock against ours
    CHECK(s.in_use <= 4);                        // the first start may have left locally

    // A window later nothing of this client's is in it.
    co_await sleep_ms(450);
    s = rl.stats();
    CHECK(s.in_use == 0);
    CHECK(s.acquired == 4);
    CHECK(s.waiting == 0);
    co_await conn->close();
  }());
}
