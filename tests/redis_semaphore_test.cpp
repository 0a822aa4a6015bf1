// SPDX-License-Identifier: BSL-1.0
// sluice::redis::semaphore against a real redis-server, with several processes.
#include <sluice/redis/semaphore.hpp>

#include <sluice/stats.hpp>

#include <support/asio.hpp>
#include <support/redis_run.hpp>
#include <support/redis_server.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
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

const char* count_in_flight_lua =
    "local v = redis.call('INCR', KEYS[1]) "
    "if v > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], v) end "
    "return v";

// Child: `coroutines` coroutines around a simulated call of 5-15 ms, sharing
// one redis::semaphore; counts in flight in Redis (INCR/DECR).
const sluice_test::register_child fleet_worker{
    "fleet_worker", [](const std::vector<std::string>& a) {
      asio::io_context ctx;
      run_for(
          ctx,
          [&]() -> asio::awaitable<void> {
            auto conn = co_await connect_to(std::stoi(a.at(0)));
            sluice::redis::semaphore sem{conn, a.at(1), 5, 2000ms};
            const int n = std::stoi(a.at(2));
            int done = 0;
            auto one = [&](int i) -> asio::awaitable<void> {
              {
                auto p = co_await sem.scoped_acquire();
                co_await conn->execute("EVAL", count_in_flight_lua, "2", "inflight", "maxseen");
                co_await sleep_ms(5 + (i * 7) % 11);
                co_await conn->execute("DECR", "inflight");
              }
              co_await conn->execute("INCR", "completed");
              ++done;
            };
            auto ex = co_await asio::this_coro::executor;
            for (int i = 0; i < n; ++i) asio::co_spawn(ex, one(i), asio::detached);
            while (done < n) co_await sleep_ms(10);
            co_await sem.close();
            co_await conn->close();
          }(),
          40s);
      return 0;
    }};

// Child: takes one permit, appends its tag to the list "order", holds it for
// 50 ms, releases.
const sluice_test::register_child fifo_waiter{
    "fifo_waiter", [](const std::vector<std::string>& a) {
      asio::io_context ctx;
      run_for(ctx, [&]() -> asio::awaitable<void> {
        auto conn = co_await connect_to(std::stoi(a.at(0)));
        sluice::redis::semaphore sem{conn, a.at(1), 2, 2000ms};
        {
          auto p = co_await sem.scoped_acquire();
          co_await conn->execute("RPUSH", "order:" + a.at(1), a.at(2));
          co_await sleep_ms(50);
        }
        co_await sem.close();
        co_await conn->close();
      }());
      return 0;
    }};

// Child: takes one permit with the given lease, says so, and holds it until killed.
const sluice_test::register_child holder{
    "holder", [](const std::vector<std::string>& a) {
      asio::io_context ctx;
      run_for(
          ctx,
          [&]() -> asio::awaitable<void> {
            auto conn = co_await connect_to(std::stoi(a.at(0)));
            sluice::redis::semaphore sem{conn, a.at(1), 1,
                                         std::chrono::milliseconds(std::stoi(a.at(2)))};
            co_await sem.acquire();
            co_await conn->execute("SET", "held:" + a.at(1), "1");
            co_await sleep_ms(60000);
          }(),
          70s);
      return 0;
    }};

asio::awaitable<void> wait_for_queue(sluice::redis::connection& c, const std::string& key,
                                     long long n) {
  for (int i = 0; i < 500; ++i) {
    if ((co_await c.execute("ZCARD", key)).integer >= n) co_return;
    co_await sleep_ms(10);
  }
  throw std::runtime_error("the queue never reached the expected length");
}

}  // namespace

TEST_CASE("4 processes x 50 coroutines never have more than 5 calls in flight",
          "[redis_semaphore]") {
  const int port = shared_redis_server().port();
  std::vector<pid_t> pids;
  for (int p = 0; p < 4; ++p) {
    pids.push_back(sluice_test::spawn_child("fleet_worker", {std::to_string(port), "fleet", "50"}));
  }
  for (pid_t pid : pids) CHECK(sluice_test::wait_process(pid) == 0);
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(port);
    CHECK(std::stoi((co_await conn->execute("GET", "maxseen")).str) == 5);
    CHECK(std::stoi((co_await conn->execute("GET", "completed")).str) == 200);
    CHECK(std::stoi((co_await conn->execute("GET", "inflight")).str) == 0);
    co_await conn->close();
  }());
}

TEST_CASE("waiters in different processes are served in ticket order", "[redis_semaphore]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(port);
    sluice::redis::semaphore sem{conn, "fifo", 2, 2000ms};
    co_await sem.acquire();
    co_await sem.acquire();  // both permits held here
    std::vector<pid_t> pids;
    const std::string queue = sem.key_prefix() + "queue";
    for (int i = 0; i < 4; ++i) {
      pids.push_back(sluice_test::spawn_child(
          "fifo_waiter", {std::to_string(port), "fifo", std::string(1, char('A' + i))}));
      co_await wait_for_queue(*conn, queue, i + 1);  // queued before the next one starts
    }
    {
      const std::size_t got7 = co_await sem.waiters();
      CHECK(got7 == 4);
    }
    {
      const bool got1 = co_await sem.try_acquire();
      CHECK_FALSE(got1);
    }
    sem.release();  // one permit circulates among the waiters, one stays here
    for (pid_t pid : pids) CHECK(sluice_test::wait_process(pid) == 0);
    reply order = co_await conn->execute("LRANGE", "order:fifo", "0", "-1");
    std::string got;
    for (auto& e : order.elements) got += e.str;
    CHECK(got == "ABCD");
    sem.release();
    {
      const std::size_t got8 = co_await sem.value();
      CHECK(got8 == 2);
    }
    co_await sem.close();
    co_await conn->close();
  }());
}

TEST_CASE("try_acquire does not barge past a queued waiter of another client",
          "[redis_semaphore]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto a = co_await connect_to(port);
    auto b = co_await connect_to(port);
    sluice::redis::semaphore sa{a, "barge", 1, 500ms};
    sluice::redis::semaphore sb{b, "barge", 1, 500ms};
    co_await sa.acquire();
    CHECK(sa.held() == 1);
    bool b_got = false;
    asio::co_spawn(
        co_await asio::this_coro::executor,
        [&]() -> asio::awaitable<void> {
          co_await sb.acquire();
          b_got = true;
        },
        asio::detached);
    co_await wait_for_queue(*a, sa.key_prefix() + "queue", 1);
    sa.release();
    // Pipelined after the release: the permit is free, but b is in line.
    {
      const bool got2 = co_await sa.try_acquire();
      CHECK_FALSE(got2);
    }
    for (int i = 0; i < 100 && !b_got; ++i) co_await sleep_ms(10);
    CHECK(b_got);
    sb.release();
    const std::size_t free_after = co_await sb.value();  // pipelined behind b's release
    CHECK(free_after == 1);
    {
      const bool got3 = co_await sa.try_acquire();
      CHECK(got3);
    }
    CHECK_THROWS_AS(sb.release(), std::logic_error);
    sa.release();
    co_await sa.close();
    co_await sb.close();
    co_await a->close();
    co_await b->close();
  }());
}

TEST_CASE("a holder killed with SIGKILL loses its permit when its lease expires, not before",
          "[redis_semaphore]") {
  const int port = shared_redis_server().port();
  const pid_t child = sluice_test::spawn_child("holder", {std::to_string(port), "killed", "1000"});
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(port);
    for (int i = 0; i < 500 && (co_await conn->execute("GET", "held:killed")).is_nil(); ++i)
      co_await sleep_ms(10);
    co_await sleep_ms(400);  // at least one renewal happened
    ::kill(child, SIGKILL);
    CHECK(sluice_test::wait_process(child) == 128 + SIGKILL);
    sluice::redis::semaphore sem{conn, "killed", 1, 1000ms};
    reply holders =
        co_await conn->execute("ZRANGE", sem.key_prefix() + "holders", "0", "-1", "WITHSCORES");
    REQUIRE(holders.elements.size() == 2);
    const long long expiry = std::stoll(holders.elements[1].str);
    {
      const bool got4 = co_await sem.try_acquire();
      CHECK_FALSE(got4);
    }
    co_await sem.acquire();
    const long long granted = co_await sluice_test::server_time_us(*conn) / 1000;
    CHECK(granted >= expiry);
    // Found by the fallback poll (lease / 10), with slack for a loaded machine.
    CHECK(granted <= expiry + 2000);
    sem.release();
    co_await sem.close();
    co_await conn->close();
  }());
}

TEST_CASE("a live holder working past its lease keeps the permit (renewal)", "[redis_semaphore]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto a = co_await connect_to(port);
    auto b = co_await connect_to(port);
    sluice::redis::semaphore sa{a, "renewal", 1, 300ms};
    sluice::redis::semaphore sb{b, "renewal", 1, 300ms};
    co_await sa.acquire();
    for (int i = 0; i < 6; ++i) {  // 1.5 s: five leases
      co_await sleep_ms(250);
      {
        const bool got5 = co_await sb.try_acquire();
        CHECK_FALSE(got5);
      }
    }
    CHECK(sa.lost() == 0);
    sa.release();
    co_await sb.acquire();
    CHECK(sb.held() == 1);
    sb.release();
    co_await sa.close();
    co_await sb.close();
    co_await a->close();
    co_await b->close();
  }());
}

TEST_CASE("a cancelled waiter leaves the line and holds nothing", "[redis_semaphore]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(port);
    sluice::redis::semaphore sem{conn, "cancel", 1, 2000ms};
    co_await sem.acquire();
    asio::cancellation_signal sig;
    sluice::error_code got = asio::error::would_block;
    sem.async_acquire(sluice_test::bind_slot(sig.slot(), [&](sluice::error_code ec) { got = ec; }));
    co_await wait_for_queue(*conn, sem.key_prefix() + "queue", 1);
    sig.emit(asio::cancellation_type::terminal);
    for (int i = 0; i < 100 && got == asio::error::would_block; ++i) co_await sleep_ms(5);
    CHECK(got == asio::error::operation_aborted);
    {
      const std::size_t got9 = co_await sem.waiters();
      CHECK(got9 == 0);
    }
    CHECK(sem.held() == 1);
    sem.release();
    {
      const std::size_t got10 = co_await sem.value();
      CHECK(got10 == 1);
    }
    // A caller cancelled before it called: aborted, nothing sent.
    asio::cancellation_signal early;
    sluice::error_code early_ec;
    asio::co_spawn(
        co_await asio::this_coro::executor,
        [&]() -> asio::awaitable<void> {
          co_await asio::this_coro::throw_if_cancelled(false);
          asio::steady_timer t(co_await asio::this_coro::executor, 10s);
          sluice::error_code ignored;
          auto token = asio::redirect_error(asio::use_awaitable, ignored);
          co_await t.async_wait(token);  // cancelled here, from outside
          early_ec = co_await sluice_test::error_of(sem.acquire());
        },
        sluice_test::bind_slot(early.slot(), [](std::exception_ptr) {}));
    co_await sleep_ms(5);
    early.emit(asio::cancellation_type::terminal);
    for (int i = 0; i < 100 && !early_ec; ++i) co_await sleep_ms(5);
    CHECK(early_ec == asio::error::operation_aborted);
    CHECK(sem.held() == 0);
    {
      const std::size_t got11 = co_await sem.value();
      CHECK(got11 == 1);
    }
    // A callback token gets the permit.
    bool ok = false;
    sem.async_acquire([&](sluice::error_code ec) { ok = !ec; });
    for (int i = 0; i < 100 && !ok; ++i) co_await sleep_ms(5);
    CHECK(ok);
    CHECK(sem.held() == 1);
    co_await sem.close();
    const std::size_t free_after_close = co_await sem.value();
    CHECK(free_after_close == 1);  // close released it
    co_await conn->close();
  }());
}

TEST_CASE("bad arguments are rejected at once", "[redis_semaphore]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  auto conn = run_for(ctx, connect_to(port));
  CHECK_THROWS_AS(sluice::redis::semaphore(conn, "bad", 0, 1000ms), std::invalid_argument);
  CHECK_THROWS_AS(sluice::redis::semaphore(conn, "bad", 1, 10ms), std::invalid_argument);
  CHECK_THROWS_AS(sluice::redis::semaphore(nullptr, "bad", 1, 1000ms), std::invalid_argument);
  sluice::redis::semaphore ok{conn, "bad", 1, 1000ms};
  CHECK_THROWS_AS(ok.release(), std::logic_error);
  run_for(ctx, conn->close());
}

TEST_CASE("redis-server stopped mid-run: waiters fail clearly; restarted: holders re-claim first",
          "[redis_semaphore]") {
  auto server = sluice_test::server_or_skip();
  asio::io_context ctx;
  run_for(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto a = co_await connect_to(server.port());
        auto b = co_await connect_to(server.port());
        sluice::redis::semaphore sa{a, "restart", 1, 1500ms};
        sluice::redis::semaphore sb{b, "restart", 1, 1500ms};
        co_await sa.acquire();
        std::vector<sluice::error_code> failures;
        auto ex = co_await asio::this_coro::executor;
        for (int i = 0; i < 3; ++i) {
          asio::co_spawn(
              ex,
              [&]() -> asio::awaitable<void> {
                failures.push_back(co_await sluice_test::error_of(sb.acquire()));
              },
              asio::detached);
        }
        co_await wait_for_queue(*a, sa.key_prefix() + "queue", 3);
        const auto stopped_at = std::chrono::steady_clock::now();
        server.stop();
        for (int i = 0; i < 300 && failures.size() < 3; ++i) co_await sleep_ms(10);
        REQUIRE(failures.size() == 3);
        CHECK(std::chrono::steady_clock::now() - stopped_at < 2s);
        for (auto& ec : failures) {
          CHECK((ec == sluice::redis::make_error_code(sluice::redis::errc::connection_lost) ||
                 ec == asio::error::connection_refused));
        }
        CHECK(sb.held() == 0);
        REQUIRE(server.restart());
        // The holder (still working) re-claims its permit at its next renewal;
        // nobody else gets it meanwhile, nor after.
        for (int i = 0; i < 8; ++i) {
          co_await sleep_ms(250);
          {
            const bool got6 = co_await sb.try_acquire();
            CHECK_FALSE(got6);
          }
        }
        CHECK(sa.lost() == 0);
        sa.release();
        co_await sb.acquire();  // new calls work
        CHECK(sb.held() == 1);
        co_await sa.close();
        co_await sb.close();
        co_await a->close();
        co_await b->close();
      }(),
      30s);
}

namespace {

// Polls `cond` every 2 ms for up to 2 s.
asio::awaitable<void> until(const std::function<bool()>& cond) {
  for (int i = 0; i < 1000 && !cond(); ++i) co_await sleep_ms(2);
  if (!cond()) throw std::runtime_error("the condition never held");
}

}  // namespace

TEST_CASE("redis::semaphore stats count this client's grants, waits, holds and cancellations",
          "[redis_semaphore]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(port);
    auto other_conn = co_await connect_to(port);
    sluice::redis::semaphore sem{conn, "stats-sem", 3, 2000ms};
    sluice::redis::semaphore other{other_conn, "stats-sem", 3, 2000ms};  // another client
    auto ex = co_await asio::this_coro::executor;

    sluice::stats s = sem.stats();
    CHECK(s.acquired == 0);
    CHECK(s.limit == 3);
    CHECK(s.in_use == 0);
    CHECK(s.wait.count == 0);

    // The other client holds one permit: the fleet has 2 free, this client holds none.
    auto theirs = co_await other.scoped_acquire();
    const auto t0 = std::chrono::steady_clock::now();
    auto mine = co_await sem.scoped_acquire();  // held 150 ms+
    co_await sem.acquire();                     // a bare acquire, released by release()
    const auto t1 = std::chrono::steady_clock::now();
    s = sem.stats();
    CHECK(s.acquired == 2);
    CHECK(s.in_use == 2);
    CHECK(s.waiting == 0);
    CHECK(s.wait.count == 2);
    CHECK(s.wait.total <= t1 - t0);  // each wait is a round trip inside [t0, t1]
    CHECK(s.hold.count == 0);        // nothing released yet
    CHECK(other.stats().in_use == 1);
    const std::size_t fleet_free = co_await sem.value();  // the fleet-wide view
    CHECK(fleet_free == 0);

    // A waiter that is granted when `mine` is released, 150 ms after it queued.
    std::chrono::steady_clock::time_point asked{}, granted{};
    bool waiter_done = false;
    asio::co_spawn(
        ex,
        [&]() -> asio::awaitable<void> {
          asked = std::chrono::steady_clock::now();
          auto p = co_await sem.scoped_acquire();
          granted = std::chrono::steady_clock::now();
          co_await sleep_ms(50);
        },
        [&](std::exception_ptr e) {
          waiter_done = true;
          if (e) std::rethrow_exception(e);
        });
    // A waiter cancelled while it waits, holding nothing.
    asio::cancellation_signal sig;
    sluice::error_code cancelled_ec = asio::error::would_block;
    sem.async_acquire(
        sluice_test::bind_slot(sig.slot(), [&](sluice::error_code ec) { cancelled_ec = ec; }));
    co_await until([&] { return sem.local_waiters() == 2; });
    s = sem.stats();
    CHECK(s.waiting == 2);
    CHECK(s.in_use == 2);
    const bool refused = co_await sem.try_acquire();  // nobody barges past the line
    CHECK_FALSE(refused);
    sig.emit(asio::cancellation_type::terminal);
    co_await until([&] { return cancelled_ec != asio::error::would_block; });
    CHECK(cancelled_ec == asio::error::operation_aborted);
    s = sem.stats();
    CHECK(s.cancelled == 1);
    CHECK(s.waiting == 1);

    co_await sleep_ms(150);
    const auto released_mine = std::chrono::steady_clock::now();
    mine.reset();  // hands the permit to the waiter (through the server)
    co_await until([&] { return waiter_done; });
    sem.release();  // the bare acquire's permit
    const auto t2 = std::chrono::steady_clock::now();
    theirs.reset();

    s = sem.stats();
    CHECK(s.acquired == 3);
    CHECK(s.cancelled == 1);
    CHECK(s.throttled == 0);
    CHECK(s.waiting == 0);
    CHECK(s.in_use == 0);
    CHECK(s.limit == 3);
    CHECK(s.wait.count == 3);
    // The waiter waited from `asked` until after `mine` was released.
    CHECK(s.wait.max >= released_mine - asked);
    CHECK(s.wait.max <= granted - asked);
    CHECK(s.wait.max >= 150ms);
    CHECK(s.hold.count == 3);    // the permit, the waiter's permit, the bare acquire
    CHECK(s.hold.max >= 150ms);  // `mine` (and the bare one) were held from t1 to past 150 ms
    CHECK(s.hold.min >= 50ms);   // the waiter's
    CHECK(s.hold.max <= t2 - t0);
    CHECK(other.stats().acquired == 1);
    CHECK(other.stats().hold.count == 1);

    // try_acquire counts when it grants.
    const bool got = co_await sem.try_acquire();
    CHECK(got);
    sem.release();
    s = sem.stats();
    CHECK(s.acquired == 4);
    CHECK(s.wait.count == 4);
    CHECK(s.hold.count == 4);

    co_await sem.close();
    co_await other.close();
    co_await conn->close();
    co_await other_conn->close();
  }());
}

TEST_CASE("a caller cancelled before it called acquire is refused at once, taking nothing",
          "[redis_semaphore]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto conn = co_await connect_to(port);
    sluice::redis::semaphore sem{conn, "precancel", 1, 500ms};
    int refused = 0;
    auto late_caller = [&]() -> asio::awaitable<void> {
      co_await asio::this_coro::throw_if_cancelled(false);
      try {
        co_await sleep_ms(10000);  // cancelled here...
      } catch (const sluice::system_error&) {
      }
      // ...then calls, with the one permit free.
      const auto aborted = sluice::error_code(asio::error::operation_aborted);
      if (co_await sluice_test::error_of(sem.acquire()) == aborted) ++refused;
      if (co_await sluice_test::error_of(sem.async_acquire(asio::use_awaitable)) == aborted)
        ++refused;
    };
    co_await (late_caller() || sleep_ms(1));
    CHECK(refused == 2);
    CHECK(sem.held() == 0);
    const std::size_t free_after = co_await sem.value();
    CHECK(free_after == 1);
    co_await sem.close();
    co_await conn->close();
  }());
}

TEST_CASE("a lease of hours::max() is the clock's range, not a wrapped negative",
          "[redis_semaphore]") {
  // Converted implicitly to milliseconds, hours::max() overflowed and was
  // refused as "shorter than 30 ms".
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(port);
    sluice::redis::semaphore sem{conn, "forever", 1, std::chrono::hours::max()};
    {
      auto p = co_await sem.scoped_acquire();
      CHECK(sem.held() == 1);
      const std::size_t free_now = co_await sem.value();
      CHECK(free_now == 0);
    }
    CHECK(sem.held() == 0);
    co_await sem.close();
    co_await conn->close();
  }());
}
