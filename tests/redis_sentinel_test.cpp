// SPDX-License-Identifier: BSL-1.0
// sluice::redis::connect_sentinel against a real Sentinel deployment on
// loopback (a primary, one replica, three redis-sentinel processes), with
// the primary SIGKILLed while a fleet of processes runs semaphore::run().
// Overlap and fencing tokens are recorded in shared memory by the bodies
// themselves, not by the code under test. Skipped without redis-sentinel.
#include <sluice/redis/sentinel.hpp>

#include <sluice/redis/semaphore.hpp>

#include <support/asio.hpp>
#include <support/redis_run.hpp>
#include <support/redis_sentinel.hpp>
#include <support/redis_server.hpp>

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice_test::run_for;
using sluice_test::sleep_ms;

namespace {

long long now_ns() {  // CLOCK_MONOTONIC: one clock for every process of the machine
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What the bodies record, in a file every process maps.
struct shared_log {
  static constexpr int capacity = 100000;
  std::atomic<int> in_flight;
  std::atomic<int> peak;
  std::atomic<int> stop;
  std::atomic<int> count;
  std::atomic<int> errors;
  struct entry {
    std::int64_t token;
    long long start_ns, end_ns;
    int process;
    int cancelled;
  } e[capacity];

  static shared_log* map(const std::string& path, bool create) {
    const int fd = ::open(path.c_str(), create ? O_RDWR | O_CREAT | O_TRUNC : O_RDWR, 0600);
    if (fd < 0) return nullptr;
    if (create && ::ftruncate(fd, sizeof(shared_log)) != 0) return nullptr;
    void* p = ::mmap(nullptr, sizeof(shared_log), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    return p == MAP_FAILED ? nullptr : static_cast<shared_log*>(p);
  }
};

using sluice_test::sentinels_of;

// Calls to a dead primary fail within a second, so that callers try again.
sluice::redis::options one_second_timeouts() {
  sluice::redis::options o;
  o.connect_timeout = 1s;
  o.command_timeout = 1s;
  return o;
}

// Child: 8 coroutines, each running bodies of 10-30 ms under one
// redis::semaphore{4} (lease 1 s) through connect_sentinel, until told to
// stop; any error (the failover) is retried after 20 ms.
const sluice_test::register_child sentinel_worker{
    "sentinel_worker", [](const std::vector<std::string>& a) {
      shared_log* log = shared_log::map(a.at(1), false);
      if (log == nullptr) return 3;
      const int process = std::stoi(a.at(2));
      asio::io_context ctx;
      run_for(
          ctx,
          [&]() -> asio::awaitable<void> {
            auto ex = co_await asio::this_coro::executor;
            const sluice::redis::options o = one_second_timeouts();
            auto op = sluice::redis::connect_sentinel(ex, sentinels_of(a.at(0)), "mymaster", o);
            auto conn = co_await std::move(op);  // named: g++ 12 and co_await operands
            sluice::redis::semaphore sem{conn, "sentinel-cap", 4, 1000ms};
            int running = 0;
            auto worker = [&](int w) -> asio::awaitable<void> {
              ++running;
              for (int i = 0; log->stop.load() == 0; ++i) {
                try {
                  co_await sem.run([&](std::int64_t token) -> asio::awaitable<void> {
                    struct inside {
                      shared_log* log;
                      shared_log::entry* e;
                      ~inside() {
                        e->end_ns = now_ns();
                        log->in_flight.fetch_sub(1);
                      }
                    };
                    const int idx = log->count.fetch_add(1);
                    shared_log::entry* e = &log->e[idx % shared_log::capacity];
                    const int now = log->in_flight.fetch_add(1) + 1;
                    int seen = log->peak.load();
                    while (now > seen && !log->peak.compare_exchange_weak(seen, now)) {
                    }
                    e->token = token;
                    e->process = process;
                    e->cancelled = 1;
                    e->start_ns = now_ns();
                    inside guard{log, e};
                    co_await sleep_ms(10 + (w * 7 + i * 3) % 21);
                    e->cancelled = 0;
                  });
                  continue;
                } catch (const std::exception&) {
                  log->errors.fetch_add(1);
                }
                co_await sleep_ms(20);  // the failover: ask again shortly
              }
              --running;
            };
            for (int w = 0; w < 8; ++w) asio::co_spawn(ex, worker(w), asio::detached);
            while (running > 0 || log->stop.load() == 0) co_await sleep_ms(10);
            co_await sem.close();
            co_await conn->close();
          }(),
          50s);
      return 0;
    }};

}  // namespace

TEST_CASE("Sentinel: the fleet resumes on the promoted replica; cap and fencing hold",
          "[redis_sentinel]") {
  auto deployment = sluice_test::redis_sentinels::start_or_skip();
  auto* d = &deployment;
  const std::string ports = d->ports_csv();
  const std::string path = d->dir() + "/log";
  shared_log* log = shared_log::map(path, true);
  REQUIRE(log != nullptr);

  std::vector<pid_t> pids;
  for (int p = 0; p < 3; ++p)
    pids.push_back(sluice_test::spawn_child("sentinel_worker", {ports, path, std::to_string(p)}));
  // Run on the first primary until bodies complete steadily (past the fresh
  // server's grace), then crash it.
  for (int i = 0; i < 300 && log->count.load() < 60; ++i) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(500ms);
  const int before = log->count.load();
  const long long killed = now_ns();
  d->kill_primary();
  // Until 60 bodies have started after the kill (or 25 s).
  auto started_after = [&] {
    int n = 0;
    for (int i = 0; i < std::min(log->count.load(), shared_log::capacity); ++i)
      n += log->e[i].start_ns > killed && log->e[i].end_ns > 0 ? 1 : 0;
    return n;
  };
  for (int i = 0; i < 2500 && started_after() < 60; ++i) std::this_thread::sleep_for(10ms);
  log->stop.store(1);
  int failed_children = 0;
  for (pid_t pid : pids) failed_children += sluice_test::wait_process(pid) == 0 ? 0 : 1;

  const int n = std::min(log->count.load(), shared_log::capacity);
  std::vector<shared_log::entry> es(log->e, log->e + n);
  long long first_after = 0;
  std::int64_t max_before = 0, min_after = INT64_MAX;
  int after = 0;
  std::map<int, std::vector<shared_log::entry>> by_process;
  for (const auto& e : es) {
    by_process[e.process].push_back(e);
    if (e.start_ns < killed) {
      max_before = std::max(max_before, e.token);
    } else {
      ++after;
      min_after = std::min(min_after, e.token);
      if (first_after == 0 || e.start_ns < first_after) first_after = e.start_ns;
    }
  }
  std::vector<std::int64_t> tokens;
  for (const auto& e : es) tokens.push_back(e.token);
  std::sort(tokens.begin(), tokens.end());
  const bool distinct = std::adjacent_find(tokens.begin(), tokens.end()) == tokens.end();
  bool per_process_increasing = true;
  for (auto& [p, v] : by_process) {
    std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.start_ns < y.start_ns; });
    for (std::size_t i = 1; i < v.size(); ++i)
      per_process_increasing = per_process_increasing && v[i].token > v[i - 1].token;
  }
  const double resume_s = first_after > 0 ? static_cast<double>(first_after - killed) / 1e9 : -1;
  std::printf(
      "sentinel failover: %d bodies before the kill, %d after; time to resume %.2f s; peak %d "
      "of 4; %d errors retried; tokens %lld (last before) < %lld (first after)\n",
      before, after, resume_s, log->peak.load(), log->errors.load(),
      static_cast<long long>(max_before), static_cast<long long>(min_after));
  const std::string role = sluice_test::redis_sentinels::raw(d->replica_port(), {"ROLE"});
  CHECK(role.find("master") != std::string::npos);  // the replica was promoted
  CHECK(failed_children == 0);
  CHECK(before >= 60);
  CHECK(after >= 60);  // the fleet resumed
  CHECK(log->peak.load() <= 4);
  CHECK(log->peak.load() >= 2);
  CHECK(log->in_flight.load() == 0);
  CHECK(distinct);
  CHECK(per_process_increasing);
  CHECK(max_before < min_after);  // fencing tokens keep increasing across the failover
  CHECK(resume_s > 0);
  CHECK(resume_s < 15);
  ::munmap(log, sizeof(shared_log));
}

namespace {

// The number of pub/sub clients (our +switch-master watcher; sentinels do
// not subscribe on each other) connected to the sentinels.
int watchers(const sluice_test::redis_sentinels& d) {
  int n = 0;
  for (int port : d.sentinel_ports()) {
    const std::string list = sluice_test::redis_sentinels::raw(port, {"CLIENT", "LIST"});
    for (std::size_t at = list.find(" sub=1 "); at != std::string::npos;
         at = list.find(" sub=1 ", at + 1))
      ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("Sentinel: a failover with the old primary up moves every connection; close ends all",
          "[redis_sentinel]") {
  auto deployment = sluice_test::redis_sentinels::start_or_skip();
  auto* d = &deployment;
  const std::string ports = d->ports_csv();
  asio::io_context ctx;
  double moved_s = -1;
  int watching = 0;
  run_for(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        const sluice::redis::options o = one_second_timeouts();
        const std::vector<sluice::redis::sentinel_address> sentinels = sentinels_of(ports);
        // clang-format off
auto conn = co_await sluice::redis::connect_sentinel(ex, sentinels, "mymaster", o);
sluice::redis::semaphore cap{conn, "places-api", 4, std::chrono::seconds(1)};
        // clang-format on
        {
          auto permit = co_await cap.scoped_acquire();
          CHECK(permit.fencing_token() > 0);
        }
        co_await cap.close();
        auto& c = conn;
        auto c2 = co_await c->connect_again();  // as a semaphore's pub/sub connection
        auto port_of = [](sluice::redis::connection& x) -> asio::awaitable<int> {
          sluice::redis::reply r = co_await x.execute("CONFIG", "GET", "port");
          co_return std::stoi(r.elements.at(1).str);
        };
        CHECK(co_await port_of(*c) == d->primary_port());
        CHECK(co_await port_of(*c2) == d->primary_port());
        co_await c->execute("SET", "before", "1");
        for (int i = 0; i < 100 && watchers(*d) == 0; ++i) co_await sleep_ms(10);
        watching = watchers(*d);
        const auto t0 = std::chrono::steady_clock::now();
        const std::string ok = sluice_test::redis_sentinels::raw(
            d->sentinel_ports().front(), {"SENTINEL", "FAILOVER", "mymaster"});
        CHECK(ok.rfind("+OK", 0) == 0);
        // Writes fail for a moment (READONLY, a reset, no primary), then land
        // on the promoted replica; both connections follow it.
        for (int i = 0; i < 400; ++i) {
          try {
            co_await c->execute("SET", "after", "1");
            if (co_await port_of(*c) == d->replica_port()) break;
          } catch (const std::exception&) {
          }
          co_await sleep_ms(25);
        }
        moved_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        CHECK(co_await port_of(*c) == d->replica_port());
        CHECK((co_await c->execute("GET", "before")).str == "1");  // replicated
        int c2_port = 0;
        for (int i = 0; i < 100 && c2_port != d->replica_port(); ++i) {
          try {
            c2_port = co_await port_of(*c2);
          } catch (const std::exception&) {
          }
          if (c2_port != d->replica_port()) co_await sleep_ms(25);
        }
        CHECK(c2_port == d->replica_port());
        co_await c2->close();
        CHECK(watchers(*d) == 1);  // c still open: the watcher stays
        co_await c->close();       // the last of the group: ends it and waits
        CHECK(watchers(*d) == 0);
      }(),
      30s);
  std::printf("manual failover: writes landed on the promoted replica after %.2f s\n", moved_s);
  CHECK(watching == 1);
  CHECK(moved_s > 0);
}

TEST_CASE("Sentinel: an unknown master name or unreachable sentinels fail clearly",
          "[redis_sentinel]") {
  asio::io_context ctx;
  auto ex = ctx.get_executor();
  const auto nobody = static_cast<std::uint16_t>(sluice_test::free_port());
  const auto start = std::chrono::steady_clock::now();
  try {
    run_for(ctx, sluice::redis::connect_sentinel(ex, {{"127.0.0.1", nobody}}, "mymaster"));
    FAIL("no exception");
  } catch (const sluice::system_error& e) {
    CHECK(e.code() == sluice::redis::make_error_code(sluice::redis::errc::no_primary));
    CHECK(std::string(e.what()).find("mymaster") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - start < 2s);
  CHECK_THROWS_AS(run_for(ctx, sluice::redis::connect_sentinel(ex, {}, "mymaster")),
                  std::invalid_argument);
  CHECK_THROWS_AS(run_for(ctx, sluice::redis::connect_sentinel(ex, {{"127.0.0.1", nobody}}, "")),
                  std::invalid_argument);
}
