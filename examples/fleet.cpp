// SPDX-License-Identifier: BSL-1.0
// A fleet of 4 replicas of the amenity-discovery client (14 calls of 1-5 s to a
// places API that allows 5 in flight), as 4 separate processes.
//
// First each process caps itself with its own sluice::semaphore{5}: the
// provider sees up to 20 calls at once. Then all 4 share one
// sluice::redis::semaphore{5} (and a sluice::redis::rate_limiter) on a
// redis-server this program starts: the provider never sees more than 5.
// The provider's in-flight count is kept in Redis (INCR/DECR), so it is
// measured across the processes.
//
//   fleet              latencies scaled by 1/20 (50-250 ms per call)
//   fleet --virtual    scaled by 1/100: a fast real run for the test suite
//                      (it still starts redis-server and 8 processes)
//
// Needs redis-server on PATH (Debian: redis-server); without it, it says so
// and exits with 77 (reported as skipped by the test suite).

#include <sluice/asio.hpp>
#include <sluice/gather.hpp>
#include <sluice/redis/rate_limiter.hpp>
#include <sluice/redis/semaphore.hpp>
#include <sluice/semaphore.hpp>

#include "support/redis_run.hpp"
#include "support/redis_server.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

using namespace std::chrono_literals;

namespace {

const std::vector<std::string> queries = {"hospital",
                                          "bank",
                                          "school",
                                          "pharmacy",
                                          "gym",
                                          "laundry",
                                          "restaurant",
                                          "coffee",
                                          "grocery/continente",
                                          "grocery/pingo-doce",
                                          "grocery/lidl",
                                          "grocery/aldi",
                                          "grocery/intermarche",
                                          "grocery/supermarket"};

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 14695981039346656037ULL;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ULL;
  return h;
}

const char* enter_provider_lua =
    "local v = redis.call('INCR', KEYS[1]) "
    "if v > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], v) end "
    "return v";

// The provider's side of fencing: a write to a record carries the writer's
// token; a token lower than the record's last one is rejected (counted).
// Each call writes its own record (the query and the replica): the 5 holders
// of a semaphore{5} overlap by design, so two of them writing one record in
// the order opposite to their grants is not a stale write.
const char* fenced_write_lua =
    "local last = tonumber(redis.call('GET', KEYS[1]) or '0') "
    "if tonumber(ARGV[1]) < last then redis.call('INCR', KEYS[3]) return 0 end "
    "redis.call('SET', KEYS[1], ARGV[1]) redis.call('RPUSH', KEYS[2], ARGV[1]) return 1";

// One client process: 14 calls gathered at once, each behind the cap.
int run_client(int port, int replica, double scale, const std::string& mode) {
  asio::io_context ctx;
  sluice_examples::run_for(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto conn = co_await sluice_examples::connect_to(port);
        sluice::semaphore local_cap{5};
        sluice::redis::semaphore fleet_cap{conn, "places-api", 5, 1000ms};
        sluice::redis::rate_limiter fleet_rate{conn, "places-api:rate", 200, 1s};
        const std::string inflight = "provider:" + mode + ":inflight";
        const std::string peak = "provider:" + mode + ":max";
        // The places API answering; `token` is the caller's fencing token (0
        // without one). The provider keeps, per record, the highest token that
        // wrote it and rejects a lower one: a holder paused past its lease
        // cannot overwrite what a newer holder wrote to the same record. Here
        // every call has a record of its own, so a healthy run rejects none;
        // tests/redis_lease_safety_test.cpp pauses a holder to see one rejected.
        auto provider = [&](const std::string& query, std::int64_t token) -> asio::awaitable<void> {
          co_await conn->execute("EVAL", enter_provider_lua, "2", inflight, peak);
          const auto latency = std::chrono::milliseconds(
              static_cast<long>((1000 + static_cast<long>(fnv1a(query) % 4001)) * scale));
          co_await sluice_examples::sleep_ms(latency.count());
          if (token != 0) {
            sluice::redis::reply r = co_await conn->execute(
                "EVAL", fenced_write_lua, "3",
                "provider:record:" + query, "provider:tokens",
                "provider:rejected", std::to_string(token));
            (void)r;
          }
          co_await conn->execute("DECR", inflight);
        };
        auto call = [&](std::string query) -> asio::awaitable<void> {
          if (mode == "local") {
            co_await local_cap.acquire();
            co_await provider(query, 0);
            local_cap.release();
          } else {
            // The body is cancelled (and run() throws lease_lost) if the
            // permit's lease stops being certain while it runs.
            co_await fleet_cap.run([&](std::int64_t token) -> asio::awaitable<void> {
              co_await fleet_rate.acquire();
              co_await provider(query, token);
            });
          }
        };
        std::vector<asio::awaitable<void>> calls;
        for (const auto& q : queries) calls.push_back(call(q + "#" + std::to_string(replica)));
        co_await sluice::gather(std::move(calls));
        co_await fleet_cap.close();
        co_await conn->close();
      }(),
      120s);
  return 0;
}

struct fleet_result {
  long long max_in_flight = 0;
  double seconds = 0;
  bool ok = true;
};

fleet_result run_fleet(int port, const char* scale, const std::string& mode) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r) {
    pids.push_back(sluice_examples::spawn_child(
        "client", {std::to_string(port), std::to_string(r), scale, mode}));
  }
  fleet_result out;
  for (pid_t pid : pids) out.ok = sluice_examples::wait_process(pid) == 0 && out.ok;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  asio::io_context ctx;
  out.max_in_flight = sluice_examples::run_for(ctx, [&]() -> asio::awaitable<long long> {
    auto conn = co_await sluice_examples::connect_to(port);
    sluice::redis::reply r = co_await conn->execute("GET", "provider:" + mode + ":max");
    co_await conn->close();
    co_return r.is_nil() ? 0 : std::stoll(r.str);
  }());
  return out;
}

const sluice_examples::register_child client_role{
    "client", [](const std::vector<std::string>& a) {
      return run_client(std::stoi(a.at(0)), std::stoi(a.at(1)), std::stod(a.at(2)), a.at(3));
    }};

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--child") == 0) {
    auto it = sluice_examples::child_roles().find(argv[2]);
    if (it == sluice_examples::child_roles().end()) return 2;
    return it->second(std::vector<std::string>(argv + 3, argv + argc));
  }
  const bool fast = argc > 1 && std::strcmp(argv[1], "--virtual") == 0;
  const char* scale = fast ? "0.01" : "0.05";
  auto server = sluice_examples::redis_server::start();
  if (!server) {
    std::printf("SKIPPED: could not start redis-server (Debian: apt-get install redis-server)\n");
    return sluice_examples::skip_exit_code;
  }
  std::printf(
      "A fleet of 4 amenity-discovery clients (separate processes), 14 calls each,\n"
      "latencies 1-5 s scaled by %s; a private redis-server on 127.0.0.1:%d.\n\n",
      scale, server->port());

  {
    // A fresh server grants nothing for one renewal interval + a margin after
    // it starts (so that holders can re-claim their permits after a restart):
    // wait that out here, so that the timings below show the cap alone.
    asio::io_context ctx;
    sluice_examples::run_for(ctx, [&]() -> asio::awaitable<void> {
      auto conn = co_await sluice_examples::connect_to(server->port());
      sluice::redis::semaphore warm{conn, "places-api", 5, 1000ms};
      co_await warm.acquire();
      warm.release();
      co_await warm.close();
      co_await conn->close();
    }());
  }
  const fleet_result local = run_fleet(server->port(), scale, "local");
  std::printf(
      "each process with its own sluice::semaphore{5}:\n"
      "  max in flight at the provider: %lld (the provider allows 5), %.2f s\n\n",
      local.max_in_flight, local.seconds);
  const fleet_result shared = run_fleet(server->port(), scale, "redis");
  std::printf(
      "one sluice::redis::semaphore{5} + rate_limiter{200/s} shared by the fleet:\n"
      "  max in flight at the provider: %lld, %.2f s\n",
      shared.max_in_flight, shared.seconds);
  auto [tokens, rejected] = [&] {
    asio::io_context ctx;
    return sluice_examples::run_for(
        ctx, [&]() -> asio::awaitable<std::pair<std::vector<long long>, long long>> {
          auto conn = co_await sluice_examples::connect_to(server->port());
          sluice::redis::reply r = co_await conn->execute("LRANGE", "provider:tokens", "0", "-1");
          sluice::redis::reply x = co_await conn->execute("GET", "provider:rejected");
          co_await conn->close();
          std::vector<long long> t;
          for (const auto& e : r.elements) t.push_back(std::stoll(e.str));
          co_return std::make_pair(std::move(t), x.is_nil() ? 0LL : std::stoll(x.str));
        }());
  }();
  std::sort(tokens.begin(), tokens.end());
  const bool distinct = std::adjacent_find(tokens.begin(), tokens.end()) == tokens.end();
  std::printf(
      "  fencing tokens the provider saw: %zu grants, %s, %lld .. %lld; stale writes "
      "rejected: %lld\n",
      tokens.size(), distinct ? "all distinct" : "DUPLICATES", tokens.empty() ? 0 : tokens.front(),
      tokens.empty() ? 0 : tokens.back(), rejected);
  const bool ok = local.ok && shared.ok && shared.max_in_flight == 5 && local.max_in_flight > 5 &&
                  distinct && tokens.size() == 4 * queries.size() && rejected == 0;
  if (!ok) std::printf("UNEXPECTED: the fleet-wide cap or the fencing did not hold\n");
  return ok ? 0 : 1;
}
