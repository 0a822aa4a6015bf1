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
//   fleet --cluster    the shared limits on a 3-node Redis Cluster this program
//                      starts (redis-cli --cluster create), reached with
//                      sluice::redis::connect_cluster; mid-run the slot of
//                      {places-api} moves to another node (a resharding). The
//                      provider's counters stay on the plain redis-server.
//   fleet --llm        only the LLM shape (also run after the default run):
//                      4 processes share an account's RPM + TPM + 8 in flight
//                      through sluice::redis::acquire_all in front of a
//                      slow_server that throttles past that quota
//                      (support/redis_llm_fleet.hpp)
//   fleet --sentinel   the shared cap through sluice::redis::connect_sentinel
//                      on a primary + replica + 3 redis-sentinels it starts;
//                      the primary is SIGKILLed mid-run, the fleet carries on
//                      on the promoted replica (the provider's counts live on
//                      a server of their own)
//
// Needs redis-server on PATH (Debian: redis-server; --sentinel also
// redis-sentinel); without it, it says so and exits with 77 (reported as
// skipped by the test suite).

#include <sluice/asio.hpp>
#include <sluice/gather.hpp>
#include <sluice/redis/cluster.hpp>
#include <sluice/redis/rate_limiter.hpp>
#include <sluice/redis/semaphore.hpp>
#include <sluice/redis/sentinel.hpp>
#include <sluice/semaphore.hpp>

#include "support/redis_cluster.hpp"
#include "support/redis_llm_fleet.hpp"
#include "support/redis_run.hpp"
#include "support/redis_sentinel.hpp"
#include "support/redis_server.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
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

long long now_ns() {  // CLOCK_MONOTONIC: one clock for every process
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The connection the fleet-wide limits use: the plain server's, or (cluster
// mode, `cluster_port` > 0) a cluster connection, or (sentinel mode,
// `sentinels` "p1,p2,p3") the primary found through the sentinels; the one
// line that changes.
asio::awaitable<std::shared_ptr<sluice::redis::connection>> limits_connection(
    std::shared_ptr<sluice::redis::connection> plain, int cluster_port,
    std::string sentinels = {}) {
  if (!sentinels.empty()) {
    sluice::redis::options o;
    o.connect_timeout = 1s;  // calls to the dead primary fail fast, and are tried again
    o.command_timeout = 1s;
    auto op =
        sluice::redis::connect_sentinel(co_await asio::this_coro::executor,
                                        sluice_examples::sentinels_of(sentinels), "mymaster", o);
    co_return co_await std::move(op);
  }
  if (cluster_port <= 0) co_return plain;
  const std::vector<std::pair<std::string, std::uint16_t>> seeds{
      {"127.0.0.1", static_cast<std::uint16_t>(cluster_port)}};
  auto op = sluice::redis::connect_cluster(co_await asio::this_coro::executor, seeds);
  co_return co_await std::move(op);
}

// One client process: 14 calls gathered at once, each behind the cap. In
// mode "sentinel" a call that fails during the failover is tried again.
int run_client(int port, int replica, double scale, const std::string& mode, int cluster_port,
               const std::string& sentinels) {
  asio::io_context ctx;
  sluice_examples::run_for(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto conn = co_await sluice_examples::connect_to(port);
        auto limits = co_await limits_connection(conn, cluster_port, sentinels);
        sluice::semaphore local_cap{5};
        sluice::redis::semaphore fleet_cap{limits, "places-api", 5, 1000ms};
        sluice::redis::rate_limiter fleet_rate{limits, "places-api:rate", 200, 1s};
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
          if (mode == "sentinel")
            co_await conn->execute("RPUSH", "provider:starts", std::to_string(now_ns()));
          bool cancelled = false;  // the lease stopped being certain (the failover)
          try {
            const auto latency = std::chrono::milliseconds(
                static_cast<long>((1000 + static_cast<long>(fnv1a(query) % 4001)) * scale));
            co_await sluice_examples::sleep_ms(latency.count());
            if (token != 0) {
              sluice::redis::reply r = co_await conn->execute(
                  "EVAL", fenced_write_lua, "3", "provider:record:" + query, "provider:tokens",
                  "provider:rejected", std::to_string(token));
              (void)r;
            }
          } catch (const sluice::system_error&) {
            cancelled = true;
          }
          co_await asio::this_coro::reset_cancellation_state();
          co_await conn->execute("DECR", inflight);  // the call left, finished or not
          if (cancelled) throw sluice::system_error(asio::error::operation_aborted);
        };
        auto call = [&](std::string query) -> asio::awaitable<void> {
          if (mode == "local") {
            co_await local_cap.acquire();
            co_await provider(query, 0);
            local_cap.release();
          } else {
            // The body is cancelled (and run() throws lease_lost) if the
            // permit's lease stops being certain while it runs. During a
            // Sentinel failover the call is tried again until it is done.
            for (;;) {
              try {
                co_await fleet_cap.run([&](std::int64_t token) -> asio::awaitable<void> {
                  co_await fleet_rate.acquire();
                  co_await provider(query, token);
                });
                break;
              } catch (const std::exception&) {
                if (mode != "sentinel") throw;
              }
              co_await sluice_examples::sleep_ms(50);
            }
          }
        };
        std::vector<asio::awaitable<void>> calls;
        for (const auto& q : queries) calls.push_back(call(q + "#" + std::to_string(replica)));
        co_await sluice::gather(std::move(calls));
        co_await fleet_cap.close();
        if (limits != conn) co_await limits->close();
        co_await conn->close();
      }(),
      120s);
  return 0;
}

struct fleet_result {
  long long max_in_flight = 0;
  double seconds = 0;
  bool ok = true;
  long long killed_ns = 0;  // --sentinel: when the primary was SIGKILLed
};

// `during`: run (in this process) while the clients run. `sentinels`: the
// limits go through them, and their primary is SIGKILLed mid-run.
fleet_result run_fleet(int port, const char* scale, const std::string& mode, int cluster_port = 0,
                       const std::function<asio::awaitable<void>()>& during = {},
                       sluice_examples::redis_sentinels* sentinels = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string ports = sentinels != nullptr ? sentinels->ports_csv() : "";
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r) {
    pids.push_back(
        sluice_examples::spawn_child("client", {std::to_string(port), std::to_string(r), scale,
                                                mode, std::to_string(cluster_port), ports}));
  }
  if (during) {
    asio::io_context ctx;
    sluice_examples::run_for(ctx, during(), 60s);
  }
  fleet_result out;
  if (sentinels != nullptr) {  // crash the primary while the fleet runs
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::strcmp(scale, "0.01") == 0 ? 300 : 800));
    out.killed_ns = now_ns();
    sentinels->kill_primary();
  }
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
      return run_client(std::stoi(a.at(0)), std::stoi(a.at(1)), std::stod(a.at(2)), a.at(3),
                        std::stoi(a.at(4)), a.size() > 5 ? a.at(5) : "");
    }};

// What the provider saw: the fencing tokens of the writes, how many were
// rejected as stale, and when calls started (--sentinel).
struct provider_view {
  std::vector<long long> tokens, starts;
  long long rejected = 0;
};

provider_view read_provider(int port) {
  asio::io_context ctx;
  return sluice_examples::run_for(ctx, [&]() -> asio::awaitable<provider_view> {
    auto conn = co_await sluice_examples::connect_to(port);
    provider_view v;
    sluice::redis::reply r = co_await conn->execute("LRANGE", "provider:tokens", "0", "-1");
    for (const auto& e : r.elements) v.tokens.push_back(std::stoll(e.str));
    sluice::redis::reply s = co_await conn->execute("LRANGE", "provider:starts", "0", "-1");
    for (const auto& e : s.elements) v.starts.push_back(std::stoll(e.str));
    sluice::redis::reply x = co_await conn->execute("GET", "provider:rejected");
    v.rejected = x.is_nil() ? 0 : std::stoll(x.str);
    co_await conn->close();
    std::sort(v.tokens.begin(), v.tokens.end());
    co_return v;
  }());
}

// --sentinel: the shared cap through Sentinel, the primary killed mid-run.
int sentinel_demo(const char* scale) {
  std::string why;
  auto d = sluice_examples::redis_sentinels::start(why);
  auto provider = sluice_examples::redis_server::start();
  if (!d || !provider) {
    std::printf("SKIPPED: %s\n", d ? "could not start redis-server" : why.c_str());
    return sluice_examples::skip_exit_code;
  }
  std::printf(
      "A fleet of 4 amenity-discovery clients sharing sluice::redis::semaphore{5} through\n"
      "Redis Sentinel (primary :%d, replica :%d, 3 sentinels, down-after 400 ms);\n"
      "latencies scaled by %s; the primary is SIGKILLed mid-run.\n\n",
      d->primary_port(), d->replica_port(), scale);
  const std::string ports = d->ports_csv();
  {
    asio::io_context ctx;  // wait out a fresh server's grace (see main)
    sluice_examples::run_for(ctx, [&]() -> asio::awaitable<void> {
      auto op = sluice::redis::connect_sentinel(co_await asio::this_coro::executor,
                                                sluice_examples::sentinels_of(ports), "mymaster");
      auto conn = co_await std::move(op);  // named: g++ 12 and co_await operands
      sluice::redis::semaphore warm{conn, "places-api", 5, 1000ms};
      co_await warm.acquire();
      warm.release();
      co_await warm.close();
      co_await conn->close();
    }());
  }
  const fleet_result r = run_fleet(provider->port(), scale, "sentinel", 0, {}, &*d);
  const provider_view v = read_provider(provider->port());
  long long first_after = 0;
  for (long long t : v.starts)
    if (t > r.killed_ns && (first_after == 0 || t < first_after)) first_after = t;
  const double resume = first_after > 0 ? static_cast<double>(first_after - r.killed_ns) / 1e9 : -1;
  const bool distinct = std::adjacent_find(v.tokens.begin(), v.tokens.end()) == v.tokens.end();
  std::printf(
      "  max in flight at the provider: %lld (the provider allows 5), %.2f s\n"
      "  first call on the promoted replica %.2f s after the SIGKILL\n"
      "  fencing tokens the provider saw: %zu writes, %s; stale writes rejected: %lld\n",
      r.max_in_flight, r.seconds, resume, v.tokens.size(), distinct ? "all distinct" : "DUPLICATES",
      v.rejected);
  const bool ok = r.ok && r.max_in_flight >= 1 && r.max_in_flight <= 5 && resume > 0 && distinct &&
                  v.tokens.size() >= 4 * queries.size() && v.rejected == 0;
  if (!ok) std::printf("UNEXPECTED: the fleet-wide cap or the fencing did not hold\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--child") == 0) {
    auto it = sluice_examples::child_roles().find(argv[2]);
    if (it == sluice_examples::child_roles().end()) return 2;
    return it->second(std::vector<std::string>(argv + 3, argv + argc));
  }
  bool fast = false, cluster_mode = false, sentinel = false, llm = false;
  for (int i = 1; i < argc; ++i) {
    fast = fast || std::strcmp(argv[i], "--virtual") == 0;
    cluster_mode = cluster_mode || std::strcmp(argv[i], "--cluster") == 0;
    sentinel = sentinel || std::strcmp(argv[i], "--sentinel") == 0;
    llm = llm || std::strcmp(argv[i], "--llm") == 0;
  }
  const char* scale = fast ? "0.01" : "0.05";
  if (sentinel) return sentinel_demo(scale);
  auto server = sluice_examples::redis_server::start();
  if (!server) {
    std::printf("SKIPPED: could not start redis-server (Debian: apt-get install redis-server)\n");
    return sluice_examples::skip_exit_code;
  }
  if (llm) return sluice_examples::llm_demo(server->port(), fast);
  auto cluster = cluster_mode ? sluice_examples::redis_cluster::start(3)
                              : std::optional<sluice_examples::redis_cluster>();
  if (cluster_mode) {
    if (!cluster) {
      std::printf("SKIPPED: could not start a Redis Cluster (redis-server, redis-cli)\n");
      return sluice_examples::skip_exit_code;
    }
  }
  const int cluster_port = cluster ? cluster->ports()[0] : 0;
  std::printf(
      "A fleet of 4 amenity-discovery clients (separate processes), 14 calls each,\n"
      "latencies 1-5 s scaled by %s; a private redis-server on 127.0.0.1:%d.\n",
      scale, server->port());
  if (cluster) {
    std::printf("The fleet-wide limits on a private 3-node Redis Cluster on 127.0.0.1:%d,%d,%d.\n",
                cluster->ports()[0], cluster->ports()[1], cluster->ports()[2]);
  }
  std::printf("\n");

  {
    // A fresh server grants nothing for one renewal interval + a margin after
    // it starts (so that holders can re-claim their permits after a restart):
    // wait that out here, so that the timings below show the cap alone.
    asio::io_context ctx;
    sluice_examples::run_for(ctx, [&]() -> asio::awaitable<void> {
      auto conn = co_await sluice_examples::connect_to(server->port());
      auto limits = co_await limits_connection(conn, cluster_port);
      sluice::redis::semaphore warm{limits, "places-api", 5, 1000ms};
      co_await warm.acquire();
      warm.release();
      co_await warm.close();
      if (limits != conn) co_await limits->close();
      co_await conn->close();
    }());
  }
  const fleet_result local = run_fleet(server->port(), scale, "local");
  std::printf(
      "each process with its own sluice::semaphore{5}:\n"
      "  max in flight at the provider: %lld (the provider allows 5), %.2f s\n\n",
      local.max_in_flight, local.seconds);
  // Cluster mode: a resharding mid-run moves the slot of {places-api} (the
  // semaphore's keys) to another node, as `redis-cli --cluster reshard` would.
  std::string moved;
  auto reshard = [&]() -> asio::awaitable<void> {
    co_await sluice_examples::sleep_ms(fast ? 100 : 500);
    const auto& ports = cluster->ports();
    const int slot = sluice::redis::key_slot("places-api");
    const int from = co_await sluice_examples::owner_port(ports[0], slot);
    const int to = sluice_examples::other_port(ports, from);
    auto m = co_await sluice_examples::migration::begin(slot, from, to, ports);
    co_await sluice_examples::sleep_ms(50);
    co_await m.move_keys();
    co_await sluice_examples::sleep_ms(50);
    co_await m.finish();
    moved = "slot " + std::to_string(slot) +
            " of {places-api} moved from :" + std::to_string(from) + " to :" + std::to_string(to) +
            " mid-run";
  };
  const fleet_result shared = cluster
                                  ? run_fleet(server->port(), scale, "redis", cluster_port, reshard)
                                  : run_fleet(server->port(), scale, "redis");
  std::printf(
      "one sluice::redis::semaphore{5} + rate_limiter{200/s} shared by the fleet%s:\n"
      "  max in flight at the provider: %lld, %.2f s%s%s\n",
      cluster ? ", on the Redis Cluster" : "", shared.max_in_flight, shared.seconds,
      moved.empty() ? "" : "\n  resharding: ", moved.c_str());
  const provider_view view = read_provider(server->port());
  const auto& tokens = view.tokens;
  const long long rejected = view.rejected;
  const bool distinct = std::adjacent_find(tokens.begin(), tokens.end()) == tokens.end();
  std::printf(
      "  fencing tokens the provider saw: %zu grants, %s, %lld .. %lld; stale writes "
      "rejected: %lld\n",
      tokens.size(), distinct ? "all distinct" : "DUPLICATES", tokens.empty() ? 0 : tokens.front(),
      tokens.empty() ? 0 : tokens.back(), rejected);
  const bool ok = local.ok && shared.ok && shared.max_in_flight == 5 && local.max_in_flight > 5 &&
                  distinct && tokens.size() == 4 * queries.size() && rejected == 0;
  if (!ok) std::printf("UNEXPECTED: the fleet-wide cap or the fencing did not hold\n");
  if (cluster) return ok ? 0 : 1;
  std::printf("\n");  // the LLM shape: an account's RPM + TPM + in flight in one step
  const int llm_status = sluice_examples::llm_demo(server->port(), fast);
  return ok && llm_status == 0 ? 0 : 1;
}
