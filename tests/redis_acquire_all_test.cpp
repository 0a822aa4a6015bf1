// SPDX-License-Identifier: BSL-1.0
// sluice::redis::acquire_all against a real redis-server (and a Redis Cluster):
// an account's RPM + TPM + concurrency taken in one script, all or none.
#include <sluice/redis/acquire_all.hpp>
#include <sluice/redis/cluster.hpp>
#include <sluice/redis/rate_limiter.hpp>
#include <sluice/redis/semaphore.hpp>

#include <support/asio.hpp>
#include <support/peak.hpp>
#include <support/redis_cluster.hpp>
#include <support/redis_run.hpp>
#include <support/redis_server.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using sluice_test::connect_to;
using sluice_test::run_for;
using sluice_test::sleep_ms;

namespace {

using sluice_test::shared_redis_server;

// Members of a sorted set, read on a connection of the test's own.
asio::awaitable<long long> zcard(sluice::redis::connection& c, const std::string& key) {
  co_return (co_await c.execute("ZCARD", key)).integer;
}

// Every trace a call can leave in the budgets' keys besides its grant: queue,
// liveness and weight entries.
asio::awaitable<long long> queued(sluice::redis::connection& c,
                                  const std::vector<std::string>& stems) {
  long long n = 0;
  for (const auto& s : stems) {
    for (const char* k : {"queue", "alive"}) n += co_await zcard(c, s + k);
    n += (co_await c.execute("HLEN", s + "weights")).integer;
  }
  co_return n;
}

// EVAL and EVALSHA calls the server has answered so far.
asio::awaitable<long long> scripts_run(sluice::redis::connection& c) {
  const std::string info = (co_await c.execute("INFO", "commandstats")).str;
  long long n = 0;
  for (const char* cmd : {"cmdstat_eval:calls=", "cmdstat_evalsha:calls="}) {
    const auto at = info.find(cmd);
    if (at != std::string::npos) n += std::stoll(info.substr(at + std::strlen(cmd)));
  }
  co_return n;
}

asio::awaitable<void> until(const bool& flag, int ms = 5000) {
  for (int i = 0; i < ms / 5 && !flag; ++i) co_await sleep_ms(5);
}

}  // namespace

TEST_CASE("redis::acquire_all refuses at once what cannot be one script in one slot",
          "[redis_acquire_all]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(port);
    auto conn2 = co_await connect_to(port);
    sluice::redis::rate_limiter rpm{conn, "{bad}:rpm", 10, 1min};
    sluice::redis::rate_limiter tpm{conn, "{bad}:tpm", 100, 1min};
    sluice::redis::rate_limiter rpm_again{conn, "{bad}:rpm", 10, 1min};
    sluice::redis::rate_limiter elsewhere{conn, "other-account:rpm", 10, 1min};
    sluice::redis::semaphore conc_on_conn2{conn2, "{bad}:conc", 2, 2s};
    // A weighted call larger than the TPM burst would never fit.
    CHECK_THROWS_AS(tpm.weighted(101), std::invalid_argument);
    CHECK_THROWS_AS(tpm.weighted(0), std::invalid_argument);
    CHECK_THROWS_WITH((void)sluice::redis::acquire_all(rpm, elsewhere),
                      Catch::Contains("different Cluster slots"));
    CHECK_THROWS_WITH((void)sluice::redis::acquire_all(rpm, conc_on_conn2),
                      Catch::Contains("same connection"));
    CHECK_THROWS_WITH((void)sluice::redis::acquire_all(rpm, tpm, rpm_again),
                      Catch::Contains("named twice"));
    CHECK_THROWS_WITH((void)sluice::redis::acquire_all(tpm.weighted(3), tpm),
                      Catch::Contains("named twice"));
    // Names: one leading hash tag, or none; nothing else with braces.
    for (const char* bad : {"{}x", "}{x", "{a}{b}", "x{a}", "{a", ""})
      CHECK_THROWS_AS(sluice::redis::rate_limiter(conn, bad, 1, 1s), std::invalid_argument);
    sluice::redis::semaphore plain_sem{conn, "plain", 1, 2s};
    sluice::redis::rate_limiter plain_rate{conn, "plain", 1, 1s};
    CHECK(plain_sem.key_prefix() == "sluice:sem:{plain}:");  // unchanged for untagged names
    CHECK(plain_rate.key() == "sluice:rate:{plain}");
    CHECK(rpm.key() == "sluice:rate:{bad}:rpm");
    // Nothing was sent.
    CHECK((co_await conn->execute("KEYS", "*{bad}*")).elements.empty());
    co_await conc_on_conn2.close();
    co_await plain_sem.close();
    co_await conn2->close();
    co_await conn->close();
  }());
}

TEST_CASE("one budget short: redis::acquire_all takes nothing, then every budget at once",
          "[redis_acquire_all]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto conn = co_await connect_to(port);
    auto plain = co_await connect_to(port);  // counts, outside the library
    sluice::redis::rate_limiter rpm{conn, "{aon}:rpm", 10, 1min};
    sluice::redis::rate_limiter tpm{conn, "{aon}:tpm", 100, 1s};
    sluice::redis::semaphore conc{conn, "{aon}:conc", 1, 2s};
    const std::string holders = conc.key_prefix() + "holders";
    const std::vector<std::string> stems{rpm.key() + ":", tpm.key() + ":", conc.key_prefix()};
    co_await tpm.acquire(95);  // 5 tokens left for a second
    sluice::redis::all_held held;
    bool got = false;
    asio::co_spawn(
        ex,
        [&]() -> asio::awaitable<void> {
          held = co_await sluice::redis::acquire_all(rpm, tpm.weighted(10), conc);
          got = true;
        },
        asio::detached);
    co_await sleep_ms(300);
    CHECK_FALSE(got);
    const long long read1 = co_await zcard(*plain, rpm.key());  // the RPM start is not taken
    CHECK(read1 == 0);
    const long long read2 = co_await zcard(*plain, holders);  // nor the permit
    CHECK(read2 == 0);
    const long long read3 = co_await zcard(*plain, tpm.key());
    CHECK(read3 == 95);
    const long long read4 = co_await zcard(*plain, rpm.key() + ":queue");  // queued on every budget
    CHECK(read4 == 1);
    const long long read5 = co_await zcard(*plain, conc.key_prefix() + "queue");
    CHECK(read5 == 1);
    co_await until(got, 3000);  // the 95 tokens leave the window
    REQUIRE(got);
    const long long read6 = co_await zcard(*plain, rpm.key());
    CHECK(read6 == 1);
    const long long read7 = co_await zcard(*plain, tpm.key());
    CHECK(read7 == 10);
    const long long read8 = co_await zcard(*plain, holders);
    CHECK(read8 == 1);
    const long long read9 = co_await queued(*plain, stems);
    CHECK(read9 == 0);
    CHECK(held.permits() == 1);
    CHECK(held.fencing_token() > 0);
    CHECK(conc.held() == 1);
    // The semaphore short: the rates are not touched until it frees.
    bool second = false;
    sluice::redis::all_held held2;
    asio::co_spawn(
        ex,
        [&]() -> asio::awaitable<void> {
          held2 = co_await sluice::redis::acquire_all(rpm, tpm.weighted(1), conc);
          second = true;
        },
        asio::detached);
    co_await sleep_ms(200);
    CHECK_FALSE(second);
    const long long read10 = co_await zcard(*plain, rpm.key());
    CHECK(read10 == 1);
    const long long read11 = co_await zcard(*plain, tpm.key());
    CHECK(read11 == 10);
    const auto first_token = held.fencing_token();
    held.release();
    co_await until(second);
    REQUIRE(second);
    const long long read12 = co_await zcard(*plain, rpm.key());
    CHECK(read12 == 2);
    const long long read13 = co_await zcard(*plain, tpm.key());
    CHECK(read13 == 11);
    CHECK(held2.fencing_token() > first_token);
    held2.release();
    co_await conn->execute("PING");  // the release is on the wire before the count
    const long long read14 = co_await zcard(*plain, holders);
    CHECK(read14 == 0);
    const long long read15 = co_await queued(*plain, stems);
    CHECK(read15 == 0);
    co_await conc.close();
    co_await plain->close();
    co_await conn->close();
  }());
}

TEST_CASE("redis::acquire_all serves callers that share a budget oldest first, across connections",
          "[redis_acquire_all]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto a = co_await connect_to(port);  // two processes' connections
    auto b = co_await connect_to(port);
    sluice::redis::rate_limiter tpm_a{a, "{fifo}:tpm", 100, 1s};
    sluice::redis::rate_limiter tpm_b{b, "{fifo}:tpm", 100, 1s};
    co_await tpm_a.acquire(50);
    std::vector<std::string> order;
    auto call = [&](sluice::redis::rate_limiter& tpm, std::size_t n,
                    std::string tag) -> asio::awaitable<void> {
      auto held = co_await sluice::redis::acquire_all(tpm.weighted(n));
      order.push_back(std::move(tag));
    };
    asio::co_spawn(ex, call(tpm_a, 80, "A"), asio::detached);  // 50 + 80 > 100: waits
    for (int i = 0; i < 100 && co_await zcard(*b, tpm_b.key() + ":queue") < 1; ++i)
      co_await sleep_ms(5);
    asio::co_spawn(ex, call(tpm_b, 30, "B"), asio::detached);  // 50 + 30 fits, but A is older
    co_await sleep_ms(300);
    CHECK(order.empty());  // B did not overtake A
    for (int i = 0; i < 800 && order.size() < 2; ++i) co_await sleep_ms(5);
    CHECK(order == std::vector<std::string>{"A", "B"});

    // A semaphore's queue is shared with its plain waiters, in ticket order.
    sluice::redis::semaphore conc_a{a, "{fifo}:conc", 1, 2s};
    sluice::redis::semaphore conc_b{b, "{fifo}:conc", 1, 2s};
    sluice::redis::rate_limiter rpm_a{a, "{fifo}:rpm", 100, 1min};
    sluice::redis::rate_limiter rpm_b{b, "{fifo}:rpm", 100, 1min};
    order.clear();
    auto first = co_await conc_a.scoped_acquire();
    auto hold = [&](auto acquire, std::string tag) -> asio::awaitable<void> {
      auto held = co_await std::move(acquire);
      order.push_back(std::move(tag));
      co_await sleep_ms(30);
    };
    const std::string queue = conc_a.key_prefix() + "queue";
    asio::co_spawn(ex, hold(sluice::redis::acquire_all(rpm_a, conc_a), "all-1"), asio::detached);
    for (int i = 0; i < 100 && co_await zcard(*a, queue) < 1; ++i) co_await sleep_ms(5);
    asio::co_spawn(ex, hold(conc_b.scoped_acquire(), "plain"), asio::detached);
    for (int i = 0; i < 100 && co_await zcard(*a, queue) < 2; ++i) co_await sleep_ms(5);
    asio::co_spawn(ex, hold(sluice::redis::acquire_all(conc_b, rpm_b), "all-2"), asio::detached);
    for (int i = 0; i < 100 && co_await zcard(*a, queue) < 3; ++i) co_await sleep_ms(5);
    first.reset();
    for (int i = 0; i < 800 && order.size() < 3; ++i) co_await sleep_ms(5);
    CHECK(order == std::vector<std::string>{"all-1", "plain", "all-2"});
    co_await conc_a.close();
    co_await conc_b.close();
    co_await a->close();
    co_await b->close();
  }());
}

TEST_CASE(
    "a redis::acquire_all cancelled while it waits, in a round trip, or before it called "
    "takes nothing",
    "[redis_acquire_all]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        auto conn = co_await connect_to(port);
        auto plain = co_await connect_to(port);
        sluice::redis::rate_limiter rpm{conn, "{cancel}:rpm", 100000, 1min};
        sluice::redis::rate_limiter tpm{conn, "{cancel}:tpm", 100000, 1min};
        sluice::redis::semaphore conc{conn, "{cancel}:conc", 1, 2s};
        const std::string holders = conc.key_prefix() + "holders";
        const std::vector<std::string> stems{rpm.key() + ":", tpm.key() + ":", conc.key_prefix()};
        // While it waits (the permit is held).
        {
          auto p = co_await conc.scoped_acquire();
          asio::cancellation_signal sig;
          sluice::error_code got = asio::error::would_block;
          asio::co_spawn(
              ex, sluice_test::error_of(sluice::redis::acquire_all(rpm, tpm.weighted(5), conc)),
              sluice_test::bind_slot(sig.slot(),
                                     [&](std::exception_ptr, sluice::error_code ec) { got = ec; }));
          for (int i = 0; i < 100 && co_await zcard(*plain, conc.key_prefix() + "queue") < 1; ++i)
            co_await sleep_ms(5);
          sig.emit(asio::cancellation_type::terminal);
          for (int i = 0; i < 200 && got == asio::error::would_block; ++i) co_await sleep_ms(5);
          CHECK(got == asio::error::operation_aborted);
          co_await conn->execute("PING");  // what it sent is done
          const long long read16 = co_await queued(*plain, stems);
          CHECK(read16 == 0);
          const long long read17 = co_await zcard(*plain, rpm.key());
          CHECK(read17 == 0);
          const long long read18 = co_await zcard(*plain, tpm.key());
          CHECK(read18 == 0);
          const long long read19 = co_await zcard(*plain, holders);  // p only
          CHECK(read19 == 1);
        }
        // At every suspension point: cancelled after 0..7 turns of the loop,
        // each call either holds all (then spends them) or nothing.
        int granted = 0, aborted = 0;
        for (int i = 0; i < 120; ++i) {
          asio::cancellation_signal sig;
          bool done = false;
          asio::co_spawn(
              ex,
              [&]() -> asio::awaitable<void> {
                auto held = co_await sluice::redis::acquire_all(rpm, tpm.weighted(3), conc);
                ++granted;
              },
              sluice_test::bind_slot(sig.slot(), [&](std::exception_ptr e) {
                if (e) ++aborted;
                done = true;
              }));
          for (int k = 0; k < i % 8; ++k) co_await asio::post(ex, asio::use_awaitable);
          sig.emit(asio::cancellation_type::terminal);
          while (!done) co_await sleep_ms(1);
        }
        co_await conn->execute("PING");
        CHECK(granted + aborted == 120);
        CHECK(aborted > 0);
        const long long read20 = co_await zcard(*plain, rpm.key());
        CHECK(read20 == granted);
        const long long read21 = co_await zcard(*plain, tpm.key());
        CHECK(read21 == 3 * granted);
        const long long read22 = co_await zcard(*plain, holders);
        CHECK(read22 == 0);
        const long long read23 = co_await queued(*plain, stems);
        CHECK(read23 == 0);
        // Cancelled before it called: refused without a round trip.
        const long long scripts_before = co_await scripts_run(*plain);
        sluice::error_code early;
        auto late_caller = [&]() -> asio::awaitable<void> {
          co_await asio::this_coro::throw_if_cancelled(false);
          try {
            co_await sleep_ms(10000);  // cancelled here...
          } catch (const sluice::system_error&) {
          }
          // ...then calls, with every budget free.
          early = co_await sluice_test::error_of(sluice::redis::acquire_all(rpm, conc));
        };
        {
          using namespace asio::experimental::awaitable_operators;
          co_await (late_caller() || sleep_ms(1));
        }
        CHECK(early == asio::error::operation_aborted);
        const long long read24 = co_await scripts_run(*plain);
        CHECK(read24 == scripts_before + 0);
        const long long read25 = co_await zcard(*plain, rpm.key());
        CHECK(read25 == granted);
        const long long read26 = co_await queued(*plain, stems);
        CHECK(read26 == 0);
        co_await conc.close();
        co_await plain->close();
        co_await conn->close();
      }(),
      60s);
}

TEST_CASE(
    "after a run_id change, waiters of the old node block redis::acquire_all no longer "
    "than the restart grace",
    "[redis_acquire_all]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  run_for(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        auto conn = co_await connect_to(port);
        auto plain = co_await connect_to(port);
        sluice::redis::rate_limiter rpm{conn, "{ghost}:rpm", 2, 1min};
        sluice::redis::semaphore conc{conn, "{ghost}:conc", 1, 2s};
        const std::string sem = conc.key_prefix(), rate = rpm.key() + ":";
        {
          auto warm = co_await sluice::redis::acquire_all(conc);  // records the run_id
        }
        // A failover as the promoted node sees it: another run_id recorded,
        // and a waiter of the old node at the head of both queues (asking for
        // the whole window), alive for 10 minutes.
        const long long now_ms = co_await sluice_test::server_time_us(*plain) / 1000;
        const std::string alive_until = std::to_string(now_ms + 600000);
        co_await plain->execute("HSET", sem + "meta", "run_id", "old-node");
        co_await plain->execute("ZADD", sem + "queue", "0", "ghost");
        co_await plain->execute("ZADD", sem + "alive", alive_until, "ghost");
        co_await plain->execute("ZADD", rate + "queue", "0", "ghost");
        co_await plain->execute("ZADD", rate + "alive", alive_until, "ghost");
        co_await plain->execute("HSET", rate + "weights", "ghost", "2");
        bool got = false;
        asio::co_spawn(
            ex,
            [&]() -> asio::awaitable<void> {
              auto held = co_await sluice::redis::acquire_all(rpm, conc);
              got = true;
            },
            asio::detached);
        co_await until(got, 15000);  // the grace is ~1 s; the ghost would stay 10 min
        CHECK(got);
        const long long sem_ghosts = co_await zcard(*plain, sem + "queue");
        const long long rate_ghosts = co_await zcard(*plain, rate + "queue");
        CHECK(sem_ghosts == 0);
        CHECK(rate_ghosts == 0);
        co_await conc.close();
        co_await plain->close();
        co_await conn->close();
      }(),
      40s);
}

TEST_CASE(
    "4 threads, each with its own io_context and connection, never exceed RPM, TPM or "
    "concurrency",
    "[redis_acquire_all]") {
  const int port = shared_redis_server().port();
  constexpr int threads = 4, coroutines = 4, calls = 4;
  constexpr std::size_t rpm_cap = 20, tpm_cap = 300, conc_cap = 3;
  const auto per = 1000ms;
  std::atomic<int> in_flight{0}, peak{0};
  std::mutex m;
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::size_t>> grants;
  auto worker = [&](int t) {
    asio::io_context ctx;
    run_for(
        ctx,
        [&]() -> asio::awaitable<void> {
          auto ex = co_await asio::this_coro::executor;
          auto conn = co_await connect_to(port);
          sluice::redis::rate_limiter rpm{conn, "{threads}:rpm", rpm_cap, per};
          sluice::redis::rate_limiter tpm{conn, "{threads}:tpm", tpm_cap, per};
          sluice::redis::semaphore conc{conn, "{threads}:conc", conc_cap, 2s};
          int done = 0;
          auto one = [&](int c) -> asio::awaitable<void> {
            for (int i = 0; i < calls; ++i) {
              const std::size_t tokens =
                  5 + static_cast<std::size_t>((t * 31 + c * 7 + i * 13) % 20);
              auto held = co_await sluice::redis::acquire_all(rpm, tpm.weighted(tokens), conc);
              {
                const std::lock_guard<std::mutex> lock(m);
                grants.emplace_back(std::chrono::steady_clock::now(), tokens);
              }
              const int now = ++in_flight;
              sluice_test::raise_peak(peak, now);
              co_await sleep_ms(20 + (c * 11 + i * 5) % 30);
              --in_flight;
            }
            ++done;
          };
          for (int c = 0; c < coroutines; ++c) asio::co_spawn(ex, one(c), asio::detached);
          while (done < coroutines) co_await sleep_ms(10);
          co_await conc.close();
          co_await conn->close();
        }(),
        60s);
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back(worker, t);
  for (auto& th : ts) th.join();
  REQUIRE(grants.size() == threads * coroutines * calls);
  CHECK(peak.load() <= static_cast<int>(conc_cap));
  std::sort(grants.begin(), grants.end());
  // A grant is seen a reply after the server recorded it: windows shorter by
  // a generous margin still hold at most the caps.
  const auto window = per - 100ms;
  std::size_t worst_calls = 0, worst_tokens = 0;
  for (std::size_t i = 0; i < grants.size(); ++i) {
    std::size_t n = 0, tokens = 0;
    for (std::size_t j = i; j < grants.size() && grants[j].first - grants[i].first < window; ++j) {
      ++n;
      tokens += grants[j].second;
    }
    worst_calls = std::max(worst_calls, n);
    worst_tokens = std::max(worst_tokens, tokens);
  }
  CHECK(worst_calls <= rpm_cap);
  CHECK(worst_tokens <= tpm_cap);
  // The caps were reached, so the checks above mean something.
  CHECK(worst_calls + 4 >= rpm_cap);
}

TEST_CASE("on a Redis Cluster, each account's budgets live on the node of its hash tag",
          "[redis_acquire_all]") {
  auto cluster = sluice_test::cluster_or_skip();
  asio::io_context ctx;
  run_for(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        std::vector<std::pair<std::string, std::uint16_t>> seeds{
            {"127.0.0.1", static_cast<std::uint16_t>(cluster.ports()[0])}};
        auto conn = co_await sluice::redis::connect_cluster(ex, seeds);
        int away = 0;
        for (int i = 0; i < 6; ++i) {
          const std::string acct = "acct-" + std::to_string(i);
          sluice::redis::rate_limiter rpm{conn, "{" + acct + "}:rpm", 10, 1min};
          sluice::redis::rate_limiter tpm{conn, "{" + acct + "}:tpm", 1000, 1min};
          sluice::redis::semaphore conc{conn, "{" + acct + "}:conc", 2, 2s};
          {
            auto held = co_await sluice::redis::acquire_all(rpm, tpm.weighted(7), conc);
            CHECK(held.fencing_token() > 0);
          }
          const int owner =
              co_await sluice_test::owner_port(cluster.ports()[0], sluice::redis::key_slot(acct));
          auto node = co_await connect_to(owner);
          const long long read27 = co_await zcard(*node, rpm.key());
          CHECK(read27 == 1);
          const long long read28 = co_await zcard(*node, tpm.key());
          CHECK(read28 == 7);
          co_await node->close();
          away += owner != cluster.ports()[0];
          co_await conc.close();
        }
        CHECK(away > 0);  // some accounts live away from the seed node
        co_await conn->close();
      }(),
      60s);
}

TEST_CASE("redis.md: an account's RPM, TPM and concurrency in one step", "[docs]") {
  const int port = shared_redis_server().port();
  asio::io_context ctx;
  std::int64_t token_seen = 0;
  long long starts = 0, tokens = 0, held_during = 0, held_after = 0;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(port);
    auto plain = co_await connect_to(port);
    const std::size_t prompt_tokens = 1200;
    const std::string prompt = "Summarise the ticket";
    sluice::redis::semaphore* conc_seen = nullptr;
    auto call_llm = [&](const std::string&, std::int64_t token) -> asio::awaitable<void> {
      token_seen = token;
      held_during = co_await zcard(*plain, conc_seen->key_prefix() + "holders");
    };
    // clang-format off
sluice::redis::rate_limiter rpm{conn, "{acct-7}:rpm", 500, std::chrono::minutes(1)};
sluice::redis::rate_limiter tpm{conn, "{acct-7}:tpm", 30000, std::chrono::minutes(1)};
sluice::redis::semaphore conc{conn, "{acct-7}:conc", 8, std::chrono::seconds(30)};
    // clang-format on
    conc_seen = &conc;
    // clang-format off
{
  auto held = co_await sluice::redis::acquire_all(rpm, tpm.weighted(prompt_tokens), conc);
  co_await call_llm(prompt, held.fencing_token());
}   // the permit is released here; the start and the tokens stay spent
    // clang-format on
    co_await conn->execute("PING");
    starts = co_await zcard(*plain, rpm.key());
    tokens = co_await zcard(*plain, tpm.key());
    held_after = co_await zcard(*plain, conc.key_prefix() + "holders");
    co_await conc.close();
    co_await plain->close();
    co_await conn->close();
  }());
  CHECK(token_seen > 0);
  CHECK(held_during == 1);
  CHECK(held_after == 0);
  CHECK(starts == 1);
  CHECK(tokens == 1200);
}
