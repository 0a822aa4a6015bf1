// SPDX-License-Identifier: BSL-1.0
// sluice::redis::connect_cluster against a real Redis Cluster on loopback: three
// `redis-server --cluster-enabled yes` nodes joined by `redis-cli --cluster create`.
#include <sluice/gather.hpp>
#include <sluice/redis/cluster.hpp>
#include <sluice/redis/rate_limiter.hpp>
#include <sluice/redis/semaphore.hpp>

#include <support/asio.hpp>
#include <support/peak.hpp>
#include <support/redis_cluster.hpp>
#include <support/redis_run.hpp>
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
#include <memory>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice::redis::reply;
using sluice_test::connect_to;
using sluice_test::migration;
using sluice_test::other_port;
using sluice_test::owner_port;
using sluice_test::run_for;
using sluice_test::sleep_ms;

namespace {

using seeds_t = std::vector<std::pair<std::string, std::uint16_t>>;

// One cluster for the test cases of this binary (each uses keys of its own).
sluice_test::redis_cluster& shared_cluster() {
  static sluice_test::redis_cluster c = sluice_test::cluster_or_skip();
  return c;
}

seeds_t seeds_of(const sluice_test::redis_cluster& c, std::size_t n = 1) {
  seeds_t s;
  for (std::size_t i = 0; i < n && i < c.ports().size(); ++i)
    s.emplace_back("127.0.0.1", static_cast<std::uint16_t>(c.ports()[i]));
  return s;
}

asio::awaitable<long long> stat_calls(sluice::redis::connection& c, const std::string& cmd) {
  reply r = co_await c.execute("INFO", "commandstats");
  const std::string key = "cmdstat_" + cmd + ":calls=";
  const auto at = r.str.find(key);
  co_return at == std::string::npos ? 0 : std::stoll(r.str.substr(at + key.size()));
}

}  // namespace

TEST_CASE("the slot of a key is the CRC16 of its hash tag, modulo 16384", "[redis][cluster]") {
  using sluice::redis::key_slot;
  STATIC_REQUIRE(sluice::detail::redis_crc16("123456789") == 0x31C3);
  STATIC_REQUIRE(key_slot("123456789") == (0x31C3 & 16383));
  CHECK(key_slot("foo") == 12182);  // values from the Redis Cluster specification / CLUSTER KEYSLOT
  CHECK(key_slot("bar") == 5061);
  CHECK(key_slot("") == 0);
  CHECK(key_slot("{user1000}.following") == key_slot("{user1000}.followers"));
  CHECK(key_slot("{user1000}.following") == key_slot("user1000"));
  CHECK(key_slot("foo{}{bar}") == sluice::detail::redis_crc16("foo{}{bar}") % 16384);  // empty tag
  CHECK(key_slot("foo{{bar}}zap") == key_slot("{bar"));  // first { to first }
  CHECK(key_slot("foo{bar}{zap}") == key_slot("bar"));
  CHECK(key_slot("sluice:sem:{places}:holders") == key_slot("sluice:sem:{places}:fence"));
}

TEST_CASE("MOVED and ASK replies are parsed, other errors are not redirects", "[redis][cluster]") {
  using sluice::detail::redis_parse_redirect;
  auto m = redis_parse_redirect("MOVED 3999 127.0.0.1:6381");
  REQUIRE(m);
  CHECK_FALSE(m->ask);
  CHECK(m->slot == 3999);
  CHECK(m->to.host == "127.0.0.1");
  CHECK(m->to.port == 6381);
  auto a = redis_parse_redirect("ASK 16383 [::1]:7000");
  REQUIRE(a);
  CHECK(a->ask);
  CHECK(a->slot == 16383);
  CHECK(a->to.host == "::1");
  CHECK(a->to.port == 7000);
  auto v6 = redis_parse_redirect("MOVED 1 fe80::1:7001");
  REQUIRE(v6);
  CHECK(v6->to.host == "fe80::1");
  auto empty = redis_parse_redirect("MOVED 12 :7002");  // unknown endpoint: the sender's host
  REQUIRE(empty);
  CHECK(empty->to.host.empty());
  CHECK(empty->to.port == 7002);
  CHECK_FALSE(redis_parse_redirect("MOVED 16384 127.0.0.1:1"));
  CHECK_FALSE(redis_parse_redirect("MOVED x 127.0.0.1:1"));
  CHECK_FALSE(redis_parse_redirect("MOVED 1 127.0.0.1"));
  CHECK_FALSE(redis_parse_redirect("ASK 1 127.0.0.1:0"));
  CHECK_FALSE(redis_parse_redirect("TRYAGAIN Multiple keys request during rehashing of slot"));
  CHECK_FALSE(redis_parse_redirect("ERR MOVED 1 127.0.0.1:1"));
}

TEST_CASE("a command is routed by its first key", "[redis][cluster]") {
  using sluice::detail::redis_command_slot;
  using sluice::redis::key_slot;
  using v = std::vector<std::string>;
  CHECK(redis_command_slot(v{"GET", "a"}) == key_slot("a"));
  CHECK(redis_command_slot(v{"set", "{t}x", "1"}) == key_slot("t"));
  CHECK(redis_command_slot(v{"EVALSHA", "abc", "2", "{n}:1", "{n}:2", "arg"}) == key_slot("n"));
  CHECK(redis_command_slot(v{"EVAL", "return 1", "0", "arg"}) == -1);
  CHECK(redis_command_slot(v{"XREAD", "COUNT", "2", "STREAMS", "s", "0"}) == key_slot("s"));
  CHECK(redis_command_slot(v{"ZUNION", "2", "k1", "k2"}) == key_slot("k1"));
  for (const char* keyless : {"PING", "INFO", "PUBLISH", "SUBSCRIBE", "TIME", "SCRIPT"})
    CHECK(redis_command_slot(v{keyless, "x", "y"}) == -1);
  reply slots;
  slots.kind = sluice::redis::reply_kind::array;
  auto range = [](long long a, long long b, std::string host, long long port) {
    reply e;
    e.kind = sluice::redis::reply_kind::array;
    reply x, y, n, h, p;
    x.kind = y.kind = p.kind = sluice::redis::reply_kind::integer;
    x.integer = a;
    y.integer = b;
    h.kind = sluice::redis::reply_kind::string;
    h.str = std::move(host);
    p.integer = port;
    n.kind = sluice::redis::reply_kind::array;
    n.elements = {h, p};
    e.elements = {x, y, n};
    return e;
  };
  slots.elements = {range(0, 5460, "10.0.0.1", 7000), range(5461, 16383, "", 7001)};
  auto parsed = sluice::detail::redis_parse_slots(slots, "10.0.0.9");
  REQUIRE(parsed.size() == 2);
  CHECK(parsed[0].at.str() == "10.0.0.1:7000");
  CHECK(parsed[1].first == 5461);
  CHECK(parsed[1].at.str() == "10.0.0.9:7001");  // empty host: the node asked
  slots.elements = {range(0, 16384, "10.0.0.1", 7000)};
  CHECK_THROWS_AS(sluice::detail::redis_parse_slots(slots, "x"), std::runtime_error);
}

TEST_CASE("a cluster connection sends each key to its node, in call order per slot",
          "[redis][cluster]") {
  auto& cluster = shared_cluster();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto conn = co_await sluice::redis::connect_cluster(ex, seeds_of(cluster));
    for (int i = 0; i < 300; ++i)
      co_await conn->execute("SET", "key:" + std::to_string(i), std::to_string(i));
    // Pipelined: 200 INCRs on one key, none awaited before the next is sent.
    std::vector<long long> got;
    for (int i = 0; i < 200; ++i)
      conn->async_execute({"INCR", "{counter}"}, [&](sluice::error_code ec, reply r) {
        got.push_back(ec ? -1 : r.integer);
      });
    while (got.size() < 200) co_await sleep_ms(2);
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == static_cast<long long>(i) + 1);
    reply r = co_await conn->execute("GET", "key:17");
    CHECK(r.str == "17");
    // Every node holds some of the keys, and only those of its slots.
    long long total = 0;
    for (int port : cluster.ports()) {
      auto node = co_await connect_to(port);
      reply n = co_await node->execute("DBSIZE");
      CHECK(n.integer > 50);
      total += n.integer;
      reply k = co_await node->execute("CLUSTER", "COUNTKEYSINSLOT",
                                       std::to_string(sluice::redis::key_slot("key:17")));
      if (co_await owner_port(port, sluice::redis::key_slot("key:17")) == port)
        CHECK(k.integer == 1);
      co_await node->close();
    }
    CHECK(total == 301);
    CHECK(conn->pending() == 0);
    co_await conn->close();
  }());
}

TEST_CASE("a cluster connection rejects db != 0, MULTI, and a node that is not in a cluster",
          "[redis][cluster]") {
  auto plain = sluice_test::server_or_skip();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    const seeds_t seeds{{"127.0.0.1", static_cast<std::uint16_t>(plain.port())}};
    sluice::redis::options o;
    o.db = 2;
    bool rejected = false;
    try {
      (void)co_await sluice::redis::connect_cluster(ex, seeds, o);
    } catch (const std::invalid_argument& e) {
      rejected = std::string(e.what()).find("only database 0") != std::string::npos;
    }
    CHECK(rejected);
    std::string what;
    try {
      (void)co_await sluice::redis::connect_cluster(ex, seeds);
    } catch (const sluice::redis::server_error& e) {
      what = e.what();
    }
    CHECK(what.find("cluster support disabled") != std::string::npos);
    const seeds_t nobody{{"127.0.0.1", static_cast<std::uint16_t>(sluice_test::free_port())}};
    auto refused = co_await sluice_test::error_of(sluice::redis::connect_cluster(ex, nobody));
    CHECK(refused == asio::error::connection_refused);
  }());
  auto& cluster = shared_cluster();
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await sluice::redis::connect_cluster(co_await asio::this_coro::executor,
                                                        seeds_of(cluster));
    CHECK_THROWS_AS(conn->async_execute({"MULTI"}, [](sluice::error_code, reply) {}),
                    std::invalid_argument);
    reply pong = co_await conn->execute("PING");
    CHECK(pong.str == "PONG");
    co_await conn->close();
  }());
}

TEST_CASE("ASK is followed during a migration and MOVED after it, keeping the order of a slot",
          "[redis][cluster]") {
  auto& cluster = shared_cluster();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto conn = co_await sluice::redis::connect_cluster(ex, seeds_of(cluster));
    const int slot = sluice::redis::key_slot("mig");
    const int from = co_await owner_port(cluster.ports()[0], slot);
    const int to = other_port(cluster.ports(), from);
    co_await conn->execute("SET", "{mig}a", "1");
    auto dst_admin = co_await connect_to(to);
    co_await dst_admin->execute("CONFIG", "RESETSTAT");
    auto m = co_await migration::begin(slot, from, to, cluster.ports());
    CHECK((co_await conn->execute("GET", "{mig}a")).str == "1");  // still at the source
    co_await conn->execute("SET", "{mig}new", "2");               // not at the source: ASK
    co_await m.move_keys(1);
    CHECK((co_await conn->execute("GET", "{mig}a")).str == "1");  // moved: ASK
    CHECK((co_await conn->execute("GET", "{mig}new")).str == "2");
    CHECK(co_await stat_calls(*dst_admin, "asking") >= 3);
    // A script the target does not know yet, asked of it after ASKING.
    const std::string sha =
        (co_await conn->execute("SCRIPT", "LOAD", "return redis.call('GET', KEYS[1])")).str;
    co_await dst_admin->execute("SCRIPT", "FLUSH");
    CHECK((co_await conn->execute("EVALSHA", sha, "1", "{mig}a")).str == "1");
    // 300 pipelined INCRs of one key race the end of the migration (ASK, then MOVED).
    std::vector<long long> got;
    for (int i = 0; i < 300; ++i)
      conn->async_execute({"INCR", "{mig}n"}, [&](sluice::error_code ec, reply r) {
        got.push_back(ec ? -1 : r.integer);
      });
    co_await m.finish();
    while (got.size() < 300) co_await sleep_ms(2);
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == static_cast<long long>(i) + 1);
    CHECK((co_await conn->execute("GET", "{mig}a")).str == "1");
    auto src_admin = co_await connect_to(from);
    co_await src_admin->execute("CONFIG", "RESETSTAT");
    CHECK((co_await conn->execute("GET", "{mig}a")).str == "1");
    CHECK(co_await stat_calls(*src_admin, "get") == 0);  // the map knows the new owner
    reply n = co_await dst_admin->execute("GET", "{mig}n");
    CHECK(n.str == "300");
    co_await src_admin->close();
    co_await dst_admin->close();
    CHECK(conn->pending() == 0);
    co_await conn->close();
  }());
}

TEST_CASE("EVALSHA reaches every node: NOSCRIPT is answered by loading the script there",
          "[redis][cluster]") {
  auto& cluster = shared_cluster();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto conn = co_await sluice::redis::connect_cluster(ex, seeds_of(cluster));
    const std::string sha =
        (co_await conn->execute("SCRIPT", "LOAD", "return redis.call('INCR', KEYS[1])")).str;
    std::map<int, int> per_node;
    for (int i = 0; i < 30; ++i) {
      const std::string key = "script:" + std::to_string(i);
      reply r = co_await conn->execute("EVALSHA", sha, "1", key);
      CHECK(r.integer == 1);
      ++per_node[co_await owner_port(cluster.ports()[0], sluice::redis::key_slot(key))];
    }
    CHECK(per_node.size() == 3);
    for (int port : cluster.ports()) {  // a node that forgot it (restarted, flushed)
      auto node = co_await connect_to(port);
      co_await node->execute("SCRIPT", "FLUSH");
      co_await node->close();
    }
    for (int i = 0; i < 30; ++i) {
      reply r = co_await conn->execute("EVALSHA", sha, "1", "script:" + std::to_string(i));
      CHECK(r.integer == 2);
    }
    co_await conn->close();
  }());
}

TEST_CASE("a semaphore on a cluster records the run_id of the node that owns its slot",
          "[redis][cluster]") {
  auto& cluster = shared_cluster();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto conn = co_await sluice::redis::connect_cluster(ex, seeds_of(cluster));
    int checked = 0;
    for (int i = 0; i < 12; ++i) {
      const std::string name = "runid-" + std::to_string(i);
      sluice::redis::semaphore sem{conn, name, 1, 2000ms};
      CHECK(co_await sem.try_acquire() | true);  // writes meta (a fresh node may still be in grace)
      reply rec = co_await conn->execute("HGET", sem.key_prefix() + "meta", "run_id");
      const int port = co_await owner_port(cluster.ports()[0], sluice::redis::key_slot(name));
      auto node = co_await connect_to(port);
      reply info = co_await node->execute("INFO", "server");
      co_await node->close();
      const auto at = info.str.find("run_id:");
      CHECK(rec.str == info.str.substr(at + 7, 40));
      checked += port != cluster.ports()[0];
      co_await sem.close();
    }
    CHECK(checked > 0);  // some names live away from the seed node
    co_await conn->close();
  }());
}

namespace {

// What the fleet's processes measure, in a file each maps (MAP_SHARED): the
// caps are checked by these counters, independently of Redis.
struct fleet_shm {
  static constexpr int n = 50;
  static constexpr int recs = 512;
  struct rec {
    std::atomic<long long> send, recv;  // steady_clock ns around a granted acquire
  };
  std::atomic<long long> inflight[n], peak[n], grants[n], grants_after[n], first_after[n];
  std::atomic<long long> errors, lost, migrated;  // migrated: ns when the last move ended
  std::atomic<int> rate_n[n];
  rec rate[n][recs];
};

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

fleet_shm* map_shm(const std::string& path, bool create) {
  const int fd = ::open(path.c_str(), create ? O_RDWR | O_CREAT | O_TRUNC : O_RDWR, 0600);
  if (fd < 0) return nullptr;
  if (create && ::ftruncate(fd, sizeof(fleet_shm)) != 0) return nullptr;
  void* p = ::mmap(nullptr, sizeof(fleet_shm), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<fleet_shm*>(p);
}

constexpr std::size_t fleet_permits = 2;
constexpr std::size_t fleet_calls = 3;
constexpr auto fleet_per = 300ms;

// One process of the fleet: 50 semaphore{2} and 50 rate_limiter{3 per 300 ms},
// one coroutine each, for `ms` milliseconds. Every exception is counted.
int fleet_child(int port, const std::string& shm_path, long ms) {
  fleet_shm* shm = map_shm(shm_path, false);
  if (shm == nullptr) return 3;
  asio::io_context ctx;
  run_for(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        const seeds_t seeds{{"127.0.0.1", static_cast<std::uint16_t>(port)}};
        auto op = sluice::redis::connect_cluster(ex, seeds);
        auto conn = co_await std::move(op);
        std::vector<std::unique_ptr<sluice::redis::semaphore>> sems;
        std::vector<std::unique_ptr<sluice::redis::rate_limiter>> rates;
        for (int i = 0; i < fleet_shm::n; ++i) {
          sems.push_back(std::make_unique<sluice::redis::semaphore>(
              conn, "fleet-sem-" + std::to_string(i), fleet_permits, 2000ms));
          rates.push_back(std::make_unique<sluice::redis::rate_limiter>(
              conn, "fleet-rate-" + std::to_string(i), fleet_calls, fleet_per));
        }
        const long long end = now_ns() + ms * 1000000LL;
        auto failed = [&](const char* what, const std::exception& e) {
          ++shm->errors;
          std::fprintf(stderr, "fleet child: %s: %s\n", what, e.what());
        };
        auto sem_worker = [&](int i) -> asio::awaitable<void> {
          while (now_ns() < end) {
            try {
              auto permit = co_await sems[i]->scoped_acquire();
              const long long in = ++shm->inflight[i];
              sluice_test::raise_peak(shm->peak[i], in);
              ++shm->grants[i];
              const long long m = shm->migrated.load();
              if (m != 0 && now_ns() > m) {
                long long zero = 0;
                shm->first_after[i].compare_exchange_strong(zero, now_ns());
                ++shm->grants_after[i];
              }
              co_await sleep_ms(2 + (i * 7 + shm->grants[i].load()) % 9);
              --shm->inflight[i];
              if (permit.lost()) ++shm->lost;
            } catch (const std::exception& e) {
              failed("semaphore", e);
            }
          }
        };
        auto rate_worker = [&](int i) -> asio::awaitable<void> {
          while (now_ns() < end) {
            try {
              const long long sent = now_ns();
              co_await rates[i]->acquire();
              const int k = shm->rate_n[i]++;
              if (k < fleet_shm::recs) {
                shm->rate[i][k].send = sent;
                shm->rate[i][k].recv = now_ns();
              }
            } catch (const std::exception& e) {
              failed("rate_limiter", e);
            }
          }
        };
        std::vector<asio::awaitable<void>> all;
        for (int i = 0; i < fleet_shm::n; ++i) {
          all.push_back(sem_worker(i));
          all.push_back(rate_worker(i));
        }
        co_await sluice::gather(std::move(all));
        for (auto& s : sems) co_await s->close();
        co_await conn->close();
      }(),
      std::chrono::milliseconds(ms) + 30s);
  return 0;
}

const sluice_test::register_child fleet_role{"fleet", [](const std::vector<std::string>& a) {
                                               return fleet_child(std::stoi(a.at(0)), a.at(1),
                                                                  std::stol(a.at(2)));
                                             }};

// A proven over-admission of a limiter: more than `calls` grants whose server
// decisions (each between its send and its reply) all fall in one window.
bool rate_exceeded(const fleet_shm& shm, int i) {
  const int n = std::min(shm.rate_n[i].load(), fleet_shm::recs);
  const long long per = std::chrono::nanoseconds(fleet_per).count();
  for (int a = 0; a < n; ++a) {
    const long long from = shm.rate[i][a].send.load();
    std::size_t inside = 0;
    for (int b = 0; b < n; ++b)
      if (shm.rate[i][b].send.load() >= from && shm.rate[i][b].recv.load() < from + per) ++inside;
    if (inside > fleet_calls) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("50 semaphores and 50 rate limiters over 3 processes hold their caps while a slot moves",
          "[redis][cluster]") {
  auto& cluster = shared_cluster();
  const std::string shm_path = cluster.dir() + "/fleet.shm";
  fleet_shm* shm = map_shm(shm_path, true);
  REQUIRE(shm != nullptr);
  const long run_ms = 6000;
  std::vector<pid_t> pids;
  for (int p = 0; p < 3; ++p)
    pids.push_back(sluice_test::spawn_child(
        "fleet", {std::to_string(cluster.ports()[static_cast<std::size_t>(p)]), shm_path,
                  std::to_string(run_ms)}));
  // While they run: move the slot of fleet-sem-7 (its keys in one MIGRATE), then
  // the slot of fleet-rate-7 (one key a batch), each with pauses in the
  // MIGRATING/IMPORTING state (ASK, TRYAGAIN) before the SETSLOT NODE (MOVED).
  asio::io_context ctx;
  const int sem_slot = sluice::redis::key_slot("fleet-sem-7");
  const int rate_slot = sluice::redis::key_slot("fleet-rate-7");
  long long moved_at = 0;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    co_await sleep_ms(1000);
    for (int slot : {sem_slot, rate_slot}) {
      const int from = co_await owner_port(cluster.ports()[0], slot);
      const int to = other_port(cluster.ports(), from);
      auto m = co_await migration::begin(slot, from, to, cluster.ports());
      co_await sleep_ms(150);
      co_await m.move_keys(slot == sem_slot ? 1000 : 1);
      co_await sleep_ms(150);
      co_await m.finish();
      CHECK(co_await owner_port(cluster.ports()[0], slot) == to);
      if (slot == sem_slot) {
        moved_at = now_ns();
        shm->migrated = moved_at;
      }
    }
  }());
  for (pid_t pid : pids) CHECK(sluice_test::wait_process(pid) == 0);
  CHECK(shm->errors.load() == 0);
  CHECK(shm->lost.load() == 0);
  int at_cap = 0;
  long long grants = 0, rate_grants = 0;
  for (int i = 0; i < fleet_shm::n; ++i) {
    INFO("limiter " << i);
    CHECK(shm->peak[i].load() <= static_cast<long long>(fleet_permits));
    CHECK(shm->grants_after[i].load() > 0);  // every semaphore went on after the move
    CHECK_FALSE(rate_exceeded(*shm, i));
    CHECK(shm->rate_n[i].load() > 0);
    at_cap += shm->peak[i].load() == static_cast<long long>(fleet_permits);
    grants += shm->grants[i].load();
    rate_grants += shm->rate_n[i].load();
  }
  CHECK(at_cap >= 40);  // the test had contention: most caps were reached
  const double resume_ms = static_cast<double>(shm->first_after[7].load() - moved_at) / 1e6;
  WARN("fleet over a resharding: " << grants << " semaphore grants, " << rate_grants
                                   << " rate grants, " << at_cap
                                   << "/50 semaphores reached their cap; fleet-sem-7 granted again "
                                   << resume_ms << " ms after its slot moved");
  ::munmap(shm, sizeof(fleet_shm));
}

TEST_CASE(
    "a cancelled cluster call completes at once and later calls of its slot stay in order; "
    "close() fails what is pending",
    "[redis][cluster]") {
  auto& cluster = shared_cluster();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto conn = co_await sluice::redis::connect_cluster(ex, seeds_of(cluster));
    // BLPOP answers nil after 0.3 s; its caller is cancelled after 50 ms.
    asio::cancellation_signal sig;
    bool blpop_done = false;
    sluice::error_code blpop_ec;
    conn->async_execute({"BLPOP", "{cancel}list", "0.3"},
                        asio::bind_cancellation_slot(sig.slot(), [&](sluice::error_code ec, reply) {
                          blpop_done = true;
                          blpop_ec = ec;
                        }));
    std::string behind;
    conn->async_execute({"ECHO", "behind"}, [&](sluice::error_code, reply r) { behind = r.str; });
    long long incr = 0;
    conn->async_execute({"INCR", "{cancel}n"},
                        [&](sluice::error_code, reply r) { incr = r.integer; });
    co_await sleep_ms(50);
    sig.emit(asio::cancellation_type::terminal);
    co_await sleep_ms(10);
    CHECK(blpop_done);
    CHECK(blpop_ec == asio::error::operation_aborted);
    CHECK(incr == 0);  // same slot, behind the BLPOP on the same socket
    CHECK(conn->pending() >= 2);
    CHECK((co_await conn->execute("GET", "{cancel}n")).str == "1");  // after the BLPOP and INCR
    CHECK(behind == "behind");
    CHECK(conn->pending() == 0);
    // close(): a blocked call fails with errc::closed, later ones too.
    sluice::error_code closed_ec;
    conn->async_execute({"BLPOP", "{cancel}list", "5"},
                        [&](sluice::error_code ec, reply) { closed_ec = ec; });
    co_await sleep_ms(20);
    co_await conn->close();
    co_await sleep_ms(5);
    CHECK(closed_ec == sluice::redis::make_error_code(sluice::redis::errc::closed));
    auto later = co_await sluice_test::error_of(conn->execute("PING"));
    CHECK(later == sluice::redis::make_error_code(sluice::redis::errc::closed));
    CHECK_FALSE(conn->is_open());
  }());
}

TEST_CASE("a node that stops answering fails its calls within command_timeout; the others go on",
          "[redis][cluster]") {
  auto& cluster = shared_cluster();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    sluice::redis::options o;
    o.command_timeout = 300ms;
    auto conn = co_await sluice::redis::connect_cluster(ex, seeds_of(cluster), o);
    // Two keys on two different nodes.
    std::string stalled_key, live_key;
    int stalled_port = 0;
    for (int i = 0; stalled_key.empty() || live_key.empty(); ++i) {
      const std::string k = "stall:" + std::to_string(i);
      const int port = co_await owner_port(cluster.ports()[0], sluice::redis::key_slot(k));
      if (port == cluster.ports()[1] && stalled_key.empty()) {
        stalled_key = k;
        stalled_port = port;
      } else if (port != cluster.ports()[1] && live_key.empty()) {
        live_key = k;
      }
    }
    co_await conn->execute("SET", stalled_key, "1");
    auto admin = co_await connect_to(stalled_port);
    co_await admin->execute("CLIENT", "PAUSE", "800", "ALL");  // a stall, as SIGSTOP would
    const auto t0 = std::chrono::steady_clock::now();
    auto ec = co_await sluice_test::error_of(conn->execute("GET", stalled_key));
    const auto waited = std::chrono::steady_clock::now() - t0;
    CHECK(ec == sluice::redis::make_error_code(sluice::redis::errc::timed_out));
    CHECK(waited >= 250ms);
    CHECK(waited < 790ms);
    co_await conn->execute("SET", live_key, "2");  // another node: unaffected
    CHECK((co_await conn->execute("GET", live_key)).str == "2");
    co_await sleep_ms(600);
    CHECK((co_await conn->execute("GET", stalled_key)).str == "1");  // reconnected
    co_await admin->close();
    co_await conn->close();
  }());
}

TEST_CASE("redis.md: a semaphore and a rate limiter moved to a cluster by one line", "[docs]") {
  auto& cluster = shared_cluster();
  const auto port = static_cast<std::uint16_t>(cluster.ports()[0]);
  asio::io_context ctx;
  std::size_t free_during = 0, free_after = 0;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    // clang-format off
std::vector<std::pair<std::string, std::uint16_t>> seeds{{"127.0.0.1", port}};   // some of the nodes
sluice::redis::options o;                        // AUTH, TLS, timeouts as for connect(); db must be 0
o.command_timeout = std::chrono::seconds(1);
auto conn = co_await sluice::redis::connect_cluster(ex, seeds, o);
sluice::redis::semaphore cap{conn, "places-api", 5, std::chrono::seconds(5)};   // unchanged
sluice::redis::rate_limiter rpm{conn, "places-api:rpm", 60, std::chrono::minutes(1)};
    // clang-format on
    {
      auto permit = co_await cap.scoped_acquire();
      co_await rpm.acquire();
      free_during = co_await cap.value();
    }
    free_after = co_await cap.value();
    co_await cap.close();
    co_await conn->close();
  }());
  CHECK(free_during == 4);
  CHECK(free_after == 5);
}
