// SPDX-License-Identifier: BSL-1.0
// sluice::redis::semaphore on a real deployment's faults: a stalled server, a
// paused holder, a restart from an old snapshot, long leases, bad names. The
// overlap of holders is measured here, in this process's memory (the holders
// are coroutines of this process), never by the Redis under test.
#include <sluice/redis/semaphore.hpp>
#include <sluice/timeout.hpp>

#include <support/asio.hpp>
#include <support/redis_run.hpp>
#include <support/redis_server.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice_test::connect_to;
using sluice_test::run_for;
using sluice_test::sleep_ms;
using steady = std::chrono::steady_clock;

namespace {

// Who holds the permit, as the holders themselves record it.
struct overlap_meter {
  int inside = 0;
  int peak = 0;
  void enter() { peak = std::max(peak, ++inside); }
  void leave() { --inside; }
};

// Child: takes one permit (lease in ms), writes its fencing token to
// "token:<name>", and holds it until killed.
const sluice_test::register_child fenced_holder{
    "fenced_holder", [](const std::vector<std::string>& a) {
      asio::io_context ctx;
      run_for(
          ctx,
          [&]() -> asio::awaitable<void> {
            auto conn = co_await connect_to(std::stoi(a.at(0)));
            sluice::redis::semaphore sem{conn, a.at(1), 1,
                                         std::chrono::milliseconds(std::stoi(a.at(2)))};
            auto p = co_await sem.scoped_acquire();
            co_await conn->execute("SET", "token:" + a.at(1), std::to_string(p.fencing_token()));
            co_await sleep_ms(60000);
          }(),
          70s);
      return 0;
    }};

std::string tmp_dir() {
  char tmpl[] = "/tmp/sluice-redis-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  return d != nullptr ? d : "/tmp";
}

}  // namespace

TEST_CASE("a server stopped for 2x the lease: run() cancels the body before anyone else is granted",
          "[redis_semaphore]") {
  auto server = sluice_test::server_or_skip();
  asio::io_context ctx;
  run_for(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        auto a = co_await connect_to(server.port());
        auto b = co_await connect_to(server.port());
        sluice::redis::semaphore sa{a, "stall", 2, 1000ms};
        sluice::redis::semaphore sb{b, "stall", 2, 1000ms};
        overlap_meter meter;
        steady::time_point a_left{}, b_entered{};
        bool body_cancelled = false;
        bool a_done = false;
        bool lease_lost_thrown = false;
        auto plain = co_await sa.scoped_acquire();  // the second permit, held without run()
        asio::co_spawn(
            ex,
            [&]() -> asio::awaitable<void> {
              try {
                co_await sa.run([&]() -> asio::awaitable<void> {
                  meter.enter();
                  try {
                    for (;;) co_await sleep_ms(20);
                  } catch (...) {
                    body_cancelled = true;
                    a_left = steady::now();
                    meter.leave();
                    throw;
                  }
                });
              } catch (const sluice::redis::lease_lost&) {
                lease_lost_thrown = true;
              }
              a_done = true;
            },
            asio::detached);
        co_await sleep_ms(100);
        REQUIRE(meter.inside == 1);
        bool b_got = false;
        asio::co_spawn(
            ex,
            [&]() -> asio::awaitable<void> {
              co_await sb.acquire();
              b_entered = steady::now();
              meter.enter();
              b_got = true;
            },
            asio::detached);
        co_await sleep_ms(100);
        server.pause();              // the server's clock runs on, its leases expire
        co_await plain.wait_lost();  // the plain permit's signal
        for (int i = 0; i < 200 && !a_done; ++i) co_await sleep_ms(10);
        CHECK(a_done);
        co_await sleep_ms(2000 - 1000);
        server.resume();
        for (int i = 0; i < 500 && !b_got; ++i) co_await sleep_ms(10);
        REQUIRE(b_got);
        CHECK(body_cancelled);
        CHECK(lease_lost_thrown);
        CHECK(meter.peak == 1);
        CHECK(a_left < b_entered);
        CHECK(plain.lost());
        co_await sleep_ms(500);  // several renewal ticks: still counted once per permit
        CHECK(sa.lost() == 2);
        CHECK(sa.held() == 0);
        sb.release();
        co_await sa.close();
        co_await sb.close();
        co_await a->close();
        co_await b->close();
      }(),
      30s);
}

TEST_CASE("with_timeout(2s, acquire()) against a server stopped for 10 s returns before it resumes",
          "[redis_semaphore]") {
  auto server = sluice_test::server_or_skip();
  asio::io_context ctx;
  run_for(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto a = co_await connect_to(server.port());
        auto b = co_await connect_to(server.port());
        sluice::redis::semaphore sa{a, "frozen", 1, 3000ms};
        sluice::redis::semaphore sb{b, "frozen", 1, 3000ms};
        co_await sa.acquire();
        server.pause();
        const auto start = steady::now();
        bool timed_out = false;
        try {
          co_await sluice::with_timeout(2s, sb.acquire());
        } catch (const sluice::timeout_error&) {
          timed_out = true;
        }
        const auto waited =
            std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - start);
        std::printf("with_timeout(2s, acquire()) on a stopped server returned after %lld ms\n",
                    static_cast<long long>(waited.count()));
        CHECK(timed_out);
        CHECK(waited < 9s);  // the server would resume at 10 s
        CHECK(sb.held() == 0);
        server.resume();
        sa.release();
        co_await sa.close();
        co_await sb.close();
        co_await a->close();
        co_await b->close();
      }(),
      30s);
}

TEST_CASE("a holder paused past its lease: fencing tokens increase, the stale one is lower",
          "[redis_semaphore]") {
  const auto& server = sluice_test::shared_redis_server();
  const pid_t holder =
      sluice_test::spawn_child("fenced_holder", {std::to_string(server.port()), "fenced", "300"});
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(server.port());
    std::string stale;
    for (int i = 0; i < 500 && stale.empty(); ++i) {
      stale = (co_await conn->execute("GET", "token:fenced")).str;
      if (stale.empty()) co_await sleep_ms(10);
    }
    REQUIRE(!stale.empty());
    ::kill(holder, SIGSTOP);  // a GC pause, a swapped-out VM
    sluice::redis::semaphore sem{conn, "fenced", 1, 300ms};
    std::int64_t last = std::stoll(stale);
    for (int i = 0; i < 5; ++i) {
      auto p = co_await sem.scoped_acquire();  // granted once the paused lease expired
      CHECK(p.fencing_token() > last);
      last = p.fencing_token();
    }
    ::kill(holder, SIGKILL);
    ::kill(holder, SIGCONT);
    sluice_test::wait_process(holder);
    co_await sem.close();
    co_await conn->close();
  }());
}

TEST_CASE("a restart from an old RDB snapshot while A holds: nobody else is granted",
          "[redis_semaphore]") {
  const std::string dir = tmp_dir();
  auto server = sluice_test::server_or_skip({}, {"--dir", dir, "--dbfilename", "dump.rdb"});
  asio::io_context ctx;
  run_for(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto a = co_await connect_to(server.port());
        auto b = co_await connect_to(server.port());
        sluice::redis::semaphore sa{a, "snapshot", 1, 3000ms};
        sluice::redis::semaphore sb{b, "snapshot", 1, 3000ms};
        co_await sa.acquire();  // the keys exist (with this server's run_id) ...
        sa.release();
        co_await a->execute("SAVE");  // ... in the snapshot, without A's permit
        auto p = co_await sa.scoped_acquire();
        const auto token = p.fencing_token();
        REQUIRE(server.restart());      // loads the snapshot: A's permit is not in it
        for (int i = 0; i < 30; ++i) {  // 3 s: A keeps renewing, B never gets in
          co_await sleep_ms(100);
          bool got = false;
          try {
            got = co_await sb.try_acquire();
          } catch (const sluice::system_error&) {  // the first call after the restart
          }
          CHECK_FALSE(got);
          if (got) sb.release();
        }
        CHECK(sa.lost() == 0);
        CHECK_FALSE(p.lost());
        p.reset();
        auto q = co_await sb.scoped_acquire();
        CHECK(q.fencing_token() > token);  // even though the counter was rolled back
        q.reset();
        co_await sa.close();
        co_await sb.close();
        co_await a->close();
        co_await b->close();
      }(),
      30s);
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("a one-hour or endless lease waits seconds, not the lease, after a restart",
          "[redis_semaphore]") {
  auto server = sluice_test::server_or_skip();  // fresh: as after a restart
  asio::io_context ctx;
  run_for(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto conn = co_await connect_to(server.port());
        sluice::redis::semaphore hour{conn, "hour", 1, std::chrono::hours(1)};
        sluice::redis::semaphore endless{conn, "endless", 1, std::chrono::milliseconds::max()};
        auto p = co_await hour.scoped_acquire();
        auto q = co_await endless.scoped_acquire();
        CHECK(q.certain_until() == steady::time_point::max());
        CHECK(p.certain_until() > steady::now() + 50min);
        p.reset();
        q.reset();
        co_await hour.close();
        co_await endless.close();
        co_await conn->close();
      }(),
      10s);
}

TEST_CASE("caps above 2^53 and names that break the hash tag are rejected", "[redis_semaphore]") {
  const auto& server = sluice_test::shared_redis_server();
  asio::io_context ctx;
  auto conn = run_for(ctx, connect_to(server.port()));
  using sem = sluice::redis::semaphore;
  const std::size_t two53 = std::size_t{1} << 53;
  CHECK_THROWS_AS(sem(conn, "big", two53 + 1, 1000ms), std::invalid_argument);
  CHECK_THROWS_AS(sem(conn, "big", std::numeric_limits<std::size_t>::max(), 1000ms),
                  std::invalid_argument);
  CHECK_NOTHROW(sem(conn, "big", two53, 1000ms));
  CHECK_THROWS_AS(sem(conn, "", 1, 1000ms), std::invalid_argument);
  CHECK_THROWS_AS(sem(conn, "}{x", 1, 1000ms), std::invalid_argument);
  CHECK_THROWS_AS(sem(conn, "a{b", 1, 1000ms), std::invalid_argument);
  run_for(ctx, conn->close());
}
