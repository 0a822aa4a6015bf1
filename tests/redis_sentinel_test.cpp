// SPDX-License-Identifier: BSL-1.0
// sluice::redis::connect_sentinel against a real Sentinel deployment on
// loopback (a primary, one replica, three redis-sentinel processes), with
// the primary SIGKILLed while a fleet of processes runs semaphore::run().
// Overlap and fencing tokens are recorded in shared memory by the bodies
// themselves, not by the code under test. Skipped without redis-sentinel.
#include <sluice/redis/sentinel.hpp>

#include <sluice/redis/semaphore.hpp>

#include <support/asio.hpp>
#include <support/peak.hpp>
#include <support/redis_run.hpp>
#include <support/redis_sentinel.hpp>
#include <support/redis_server.hpp>

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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
  std::atomic<int> in_flight[2];  // per semaphore
  std::atomic<int> peak[2];
  std::atomic<int> stop;
  std::atomic<int> count;
  std::atomic<int> errors;
  struct entry {
    std::int64_t token;
    long long start_ns, end_ns;
    int process;
    int cancelled;
    int sem;  // 0, or 1 for the second semaphore
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
// redis::semaphore{4} (lease 1 s, or argument 4 in ms) through
// connect_sentinel (sentinels "p1,p2,.." in that order: the first is watched),
// until told to stop; any error (the failover) is retried after 20 ms. With a
// fifth argument (a lease in ms), the odd coroutines use a second
// semaphore{4} of that lease.
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
            const auto lease = std::chrono::milliseconds(a.size() > 3 ? std::stoi(a.at(3)) : 1000);
            const auto lease_b =
                std::chrono::milliseconds(a.size() > 4 ? std::stoi(a.at(4)) : 1000);
            sluice::redis::semaphore sem_a{conn, "sentinel-cap", 4, lease};
            sluice::redis::semaphore sem_b{conn, "sentinel-cap-b", 4, lease_b};
            int running = 0;
            auto worker = [&](int w) -> asio::awaitable<void> {
              ++running;
              const int k = a.size() > 4 ? w % 2 : 0;
              auto& sem = k == 0 ? sem_a : sem_b;
              for (int i = 0; log->stop.load() == 0; ++i) {
                try {
                  co_await sem.run([&](std::int64_t token) -> asio::awaitable<void> {
                    struct inside {
                      shared_log* log;
                      shared_log::entry* e;
                      ~inside() {
                        e->end_ns = now_ns();
                        log->in_flight[e->sem].fetch_sub(1);
                      }
                    };
                    const int idx = log->count.fetch_add(1);
                    shared_log::entry* e = &log->e[idx % shared_log::capacity];
                    const int now = log->in_flight[k].fetch_add(1) + 1;
                    sluice_test::raise_peak(log->peak[k], now);
                    e->sem = k;
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
            co_await sem_a.close();
            co_await sem_b.close();
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
    std::sort(v.begin(), v.end(),
              [](const auto& x, const auto& y) { return x.start_ns < y.start_ns; });
    for (std::size_t i = 1; i < v.size(); ++i)
      per_process_increasing = per_process_increasing && v[i].token > v[i - 1].token;
  }
  const double resume_s = first_after > 0 ? static_cast<double>(first_after - killed) / 1e9 : -1;
  std::printf(
      "sentinel failover: %d bodies before the kill, %d after; time to resume %.2f s; peak %d "
      "of 4; %d errors retried; tokens %lld (last before) < %lld (first after)\n",
      before, after, resume_s, log->peak[0].load(), log->errors.load(),
      static_cast<long long>(max_before), static_cast<long long>(min_after));
  const std::string role = sluice_test::redis_sentinels::raw(d->replica_port(), {"ROLE"});
  CHECK(role.find("master") != std::string::npos);  // the replica was promoted
  CHECK(failed_children == 0);
  CHECK(before >= 60);
  CHECK(after >= 60);  // the fleet resumed
  CHECK(log->peak[0].load() <= 4);
  CHECK(log->peak[0].load() >= 2);
  CHECK(log->in_flight[0].load() == 0);
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

namespace {

// What the bodies of one semaphore recorded in a run, swept after it.
struct sweep {
  int bodies = 0;
  int duplicates = 0;  // tokens handed out twice
  // A body with a lower token than one that ended more than `slack_ns` before
  // it started (closer than that, the time from a grant to its body's start
  // on a loaded machine reorders bodies of one server: not the library's).
  int order_violations = 0;
  long long first_after_ns = 0;  // the first body started after `from_ns` (0: none)
  int after = 0;
  int fewest_after = 0;  // of the 3 processes, the fewest bodies started after `from_ns`
};

constexpr long long slack_ns = 250'000'000;

// The bodies of semaphore `sem`; `say`: print the first order violations.
sweep sweep_log(const shared_log& log, long long from_ns, int sem = 0, bool say = false) {
  const int n = std::min(log.count.load(), shared_log::capacity);
  std::vector<shared_log::entry> es;
  for (int i = 0; i < n; ++i)
    if (log.e[i].sem == sem) es.push_back(log.e[i]);
  sweep out;
  out.bodies = static_cast<int>(es.size());
  std::vector<std::int64_t> tokens;
  for (const auto& e : es) tokens.push_back(e.token);
  std::sort(tokens.begin(), tokens.end());
  for (std::size_t i = 1; i < tokens.size(); ++i) out.duplicates += tokens[i] == tokens[i - 1];
  // By end time, with the running maximum of the tokens that ended by then.
  std::vector<std::pair<long long, std::int64_t>> ends;
  for (const auto& e : es)
    if (e.end_ns > 0) ends.emplace_back(e.end_ns, e.token);  // not still running
  std::sort(ends.begin(), ends.end());
  std::vector<std::int64_t> max_upto(ends.size());
  for (std::size_t i = 0; i < ends.size(); ++i)
    max_upto[i] = std::max(i > 0 ? max_upto[i - 1] : 0, ends[i].second);
  int per_process[3] = {0, 0, 0};
  for (const auto& e : es) {
    auto it = std::lower_bound(ends.begin(), ends.end(),
                               std::make_pair(e.start_ns - slack_ns, INT64_MIN));
    if (it != ends.begin() && max_upto[static_cast<std::size_t>(it - ends.begin()) - 1] > e.token) {
      if (++out.order_violations <= 3 && say) {  // which, for the record
        const std::int64_t above = max_upto[static_cast<std::size_t>(it - ends.begin()) - 1];
        auto y =
            std::find_if(es.begin(), es.end(), [&](const auto& x) { return x.token == above; });
        std::printf(
            "  order violation: process %d's token %lld at %+.3f s, after process %d's "
            "%lld ran %+.3f..%+.3f s\n",
            e.process, static_cast<long long>(e.token), (e.start_ns - from_ns) / 1e9, y->process,
            static_cast<long long>(above), (y->start_ns - from_ns) / 1e9,
            (y->end_ns - from_ns) / 1e9);
      }
    }
    if (e.start_ns > from_ns) {
      ++out.after;
      ++per_process[e.process % 3];
      if (out.first_after_ns == 0 || e.start_ns < out.first_after_ns)
        out.first_after_ns = e.start_ns;
    }
  }
  out.fewest_after = std::min({per_process[0], per_process[1], per_process[2]});
  return out;
}

// The sentinels' ports "p_k,p_k+1,..." starting at the k-th.
std::string ports_from(const sluice_test::redis_sentinels& d, std::size_t k) {
  std::string out;
  const auto& ps = d.sentinel_ports();
  for (std::size_t i = 0; i < ps.size(); ++i)
    out += (out.empty() ? "" : ",") + std::to_string(ps[(k + i) % ps.size()]);
  return out;
}

// Starts 3 sentinel_worker processes on `d` with `leases` (one or two
// arguments), process p asking the sentinels from the `first(p)`-th on (and
// watching that one), and waits until 60 bodies ran (or 3 s).
std::vector<pid_t> start_fleet(const sluice_test::redis_sentinels& d, const std::string& path,
                               const shared_log& log, std::size_t (*first)(int),
                               const std::vector<std::string>& leases) {
  std::vector<pid_t> pids;
  for (int p = 0; p < 3; ++p) {
    std::vector<std::string> args{ports_from(d, first(p)), path, std::to_string(p)};
    args.insert(args.end(), leases.begin(), leases.end());
    pids.push_back(sluice_test::spawn_child("sentinel_worker", args));
  }
  for (int i = 0; i < 300 && log.count.load() < 60; ++i) std::this_thread::sleep_for(10ms);
  return pids;
}

// Tells the workers to stop and waits for them; how many failed.
int stop_fleet(shared_log& log, const std::vector<pid_t>& pids) {
  log.stop.store(1);
  int failed = 0;
  for (pid_t pid : pids) failed += sluice_test::wait_process(pid) == 0 ? 0 : 1;
  return failed;
}

}  // namespace

TEST_CASE(
    "Sentinel: the watched sentinel hung, a failover requested through another: no split "
    "brain",
    "[redis_sentinel]") {
  auto deployment = sluice_test::redis_sentinels::start_or_skip();
  auto* d = &deployment;
  const std::string path = d->dir() + "/log";
  shared_log* log = shared_log::map(path, true);
  REQUIRE(log != nullptr);
  // Process 0 watches sentinel 0 (to be hung); processes 1 and 2 watch sentinel 1.
  auto first = [](int p) -> std::size_t {
    return p == 0 ? 0 : 1;
  };
  const std::vector<pid_t> pids = start_fleet(*d, path, *log, first, {"1000"});
  std::this_thread::sleep_for(300ms);
  d->pause_sentinel(0);
  const std::string ok = sluice_test::redis_sentinels::raw(d->sentinel_ports().at(1),
                                                           {"SENTINEL", "FAILOVER", "mymaster"});
  auto promoted = [&] {
    return sluice_test::redis_sentinels::raw(d->replica_port(), {"ROLE"}).find("master") !=
           std::string::npos;
  };
  for (int i = 0; i < 1500 && !promoted(); ++i) std::this_thread::sleep_for(10ms);
  const long long failover = now_ns();
  // The old primary stays writable until the sentinels demote it (8-11 s);
  // the waiters it left on the replica expire after waiter_ttl (2 s): run 4 s
  // into that window, until every process has run bodies since.
  auto fewest_after = [&] {
    return sweep_log(*log, failover).fewest_after;
  };
  std::this_thread::sleep_for(4s);
  for (int i = 0; i < 1000 && fewest_after() < 20; ++i) std::this_thread::sleep_for(10ms);
  const int failed_children = stop_fleet(*log, pids);
  d->resume_sentinel(0);
  const sweep s = sweep_log(*log, failover, 0, true);
  std::printf(
      "hung sentinel + manual failover: %d bodies, %d after the promotion (first %.2f s after, "
      "fewest of one process %d); peak %d of 4; %d duplicate tokens; %d order violations; %d "
      "errors retried\n",
      s.bodies, s.after, s.first_after_ns > 0 ? (s.first_after_ns - failover) / 1e9 : -1.0,
      s.fewest_after, log->peak[0].load(), s.duplicates, s.order_violations, log->errors.load());
  CHECK(ok.rfind("+OK", 0) == 0);
  CHECK(promoted());
  CHECK(failed_children == 0);
  CHECK(s.fewest_after >= 20);  // the whole fleet went on
  CHECK(log->peak[0].load() <= 4);
  CHECK(s.duplicates == 0);
  CHECK(s.order_violations == 0);
  ::munmap(log, sizeof(shared_log));
}

namespace {

// A TCP relay on loopback for the replica's link to its primary (the
// replication stream), in threads of this process: hold() stops passing the
// primary's bytes on, so the replica falls behind while it and the sentinels
// still see a live link (replica lag); cut() closes every link.
class replication_relay {
 public:
  explicit replication_relay(int upstream) : upstream_(upstream) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = sluice_test::loopback_address(0);
    socklen_t len = sizeof a;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listener_, 4) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  replication_relay(const replication_relay&) = delete;
  replication_relay& operator=(const replication_relay&) = delete;
  ~replication_relay() {
    ::shutdown(listener_, SHUT_RDWR);
    if (acceptor_.joinable()) acceptor_.join();
    ::close(listener_);
    cut();
    for (auto& t : pumps_) t.join();
    for (int fd : fds_) ::close(fd);
  }
  int port() const { return port_; }
  void hold() { held_.store(true); }
  long long held_back() const { return held_back_.load(); }
  void cut() {
    std::lock_guard<std::mutex> lock(m_);
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
  }

 private:
  void accept_loop() {
    for (;;) {
      const int down = ::accept(listener_, nullptr, nullptr);
      if (down < 0) return;
      const int up = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a = sluice_test::loopback_address(upstream_);
      if (::connect(up, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(up);
        ::close(down);
        continue;
      }
      std::lock_guard<std::mutex> lock(m_);
      fds_.insert(fds_.end(), {up, down});
      pumps_.emplace_back([this, up, down] { pump(down, up, false); });
      pumps_.emplace_back([this, up, down] { pump(up, down, true); });
    }
  }
  // Copies from -> to; from the primary, bytes read while held are dropped.
  void pump(int from, int to, bool from_primary) {
    char buf[16384];
    for (;;) {
      const ssize_t n = ::read(from, buf, sizeof buf);
      if (n <= 0) break;
      if (from_primary && held_.load()) {
        held_back_.fetch_add(n);
        continue;
      }
      if (::write(to, buf, static_cast<std::size_t>(n)) != n) break;
    }
    ::shutdown(to, SHUT_RDWR);
  }

  int upstream_;
  int listener_ = -1;
  int port_ = -1;
  std::atomic<bool> held_{false};
  std::atomic<long long> held_back_{0};
  std::mutex m_;
  std::vector<int> fds_;
  std::thread acceptor_;
  std::vector<std::thread> pumps_;
};

// Builds (with the system's C compiler) a preload library that sets the wall
// clock of the process it is loaded into `seconds` back; its path, or "".
std::string clock_shim(const std::string& dir, int seconds) {
  const std::string cc = sluice_test::find_program("cc");
  if (cc.empty()) return {};
  const std::string src = dir + "/clock_shim.c", so = dir + "/clock_shim.so";
  std::ofstream(src) << "#define _GNU_SOURCE\n#include <dlfcn.h>\n#include <sys/time.h>\n"
                        "#include <time.h>\nstatic int (*real_cg)(clockid_t, struct timespec*);\n"
                        "int clock_gettime(clockid_t c, struct timespec* ts) {\n"
                        "  if (!real_cg) real_cg = dlsym(RTLD_NEXT, \"clock_gettime\");\n"
                        "  int r = real_cg(c, ts);\n"
                        "  if (r == 0 && (c == CLOCK_REALTIME || c == CLOCK_REALTIME_COARSE))\n"
                        "    ts->tv_sec -= "
                     << seconds
                     << ";\n  return r;\n}\n"
                        "int gettimeofday(struct timeval* tv, void* tz) {\n"
                        "  (void)tz; struct timespec ts; clock_gettime(CLOCK_REALTIME, &ts);\n"
                        "  tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; return 0;\n}\n"
                        "time_t time(time_t* t) {\n"
                        "  struct timespec ts; clock_gettime(CLOCK_REALTIME, &ts);\n"
                        "  if (t) *t = ts.tv_sec; return ts.tv_sec;\n}\n";
  const std::string cmd = cc + " -shared -fPIC -O1 -o " + so + " " + src + " -ldl 2>/dev/null";
  return std::system(cmd.c_str()) == 0 ? so : std::string();
}

// The seconds of a TIME reply from a loopback port (0 on failure).
long long server_seconds(int port) {
  const std::string r = sluice_test::redis_sentinels::raw(port, {"TIME"});
  const std::size_t at = r.find("\r\n", r.find('$'));
  return at == std::string::npos ? 0 : std::atoll(r.c_str() + at + 2);
}

// A field of INFO replication on a loopback port (-1 if absent).
long long replication_field(int port, const std::string& field) {
  const std::string r = sluice_test::redis_sentinels::raw(port, {"INFO", "replication"});
  const std::size_t at = r.find(field + ":");
  return at == std::string::npos ? -1 : std::atoll(r.c_str() + at + field.size() + 1);
}

}  // namespace

TEST_CASE(
    "Sentinel: a SIGKILLed primary, the lagging replica's clock 10 s behind: a 30 s lease "
    "grants within seconds, tokens never repeat or go back",
    "[redis_sentinel]") {
  char tmpl[] = "/tmp/sluice-shim-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string shim = clock_shim(tmpl, 10);
  if (shim.empty()) {
    std::fprintf(stderr, "SKIPPED: no C compiler to build the clock shim\n");
    std::_Exit(sluice_test::skip_exit_code);
  }
  std::unique_ptr<replication_relay> relay;
  sluice_test::redis_sentinels::replica_setup rs;
  rs.wrapper = {"env", "LD_PRELOAD=" + shim};
  rs.failover_timeout_ms = 10000;  // the sentinels leave the relayed link alone for 10 s
  rs.upstream = [&](int primary) {
    relay = std::make_unique<replication_relay>(primary);
    return relay->port();
  };
  auto deployment = sluice_test::redis_sentinels::start_or_skip(rs);
  auto* d = &deployment;
  const long long skew = server_seconds(d->primary_port()) - server_seconds(d->replica_port());
  const std::string path = d->dir() + "/log";
  shared_log* log = shared_log::map(path, true);
  REQUIRE(log != nullptr);
  // Semaphore 0: lease 30 s (the first grant after the kill); semaphore 1:
  // lease 1 s (a grant soon after the promotion, when the replica's clock
  // term is furthest behind the tokens the fleet saw).
  auto first = [](int p) {
    return static_cast<std::size_t>(p);
  };
  const std::vector<pid_t> pids = start_fleet(*d, path, *log, first, {"30000", "1000"});
  relay->hold();  // the replica falls behind from here
  std::this_thread::sleep_for(2s);
  const long long primary_offset = replication_field(d->primary_port(), "master_repl_offset");
  const long long replica_offset = replication_field(d->replica_port(), "slave_repl_offset");
  const long long killed = now_ns();
  d->kill_primary();
  relay->cut();
  const long long after_kill = killed + slack_ns;  // bodies granted before it have started
  auto started_after = [&] {
    return std::min(sweep_log(*log, after_kill, 0).after, sweep_log(*log, after_kill, 1).after);
  };
  for (int i = 0; i < 2500 && started_after() < 40; ++i) std::this_thread::sleep_for(10ms);
  const int failed_children = stop_fleet(*log, pids);
  const sweep s30 = sweep_log(*log, after_kill, 0, true), s1 = sweep_log(*log, after_kill, 1, true);
  auto first_s = [&](const sweep& s) {
    return s.first_after_ns > 0 ? static_cast<double>(s.first_after_ns - killed) / 1e9 : -1.0;
  };
  std::printf(
      "SIGKILL, replica clock %lld s behind and %lld bytes behind: first grant after the kill "
      "%.2f s (lease 30 s), %.2f s (lease 1 s); bodies %d / %d, after %d / %d; peak %d / %d of "
      "4; duplicate tokens %d / %d; order violations %d / %d; %d errors retried\n",
      skew, primary_offset - replica_offset, first_s(s30), first_s(s1), s30.bodies, s1.bodies,
      s30.after, s1.after, log->peak[0].load(), log->peak[1].load(), s30.duplicates, s1.duplicates,
      s30.order_violations, s1.order_violations, log->errors.load());
  std::error_code ignored;
  std::filesystem::remove_all(tmpl, ignored);
  CHECK(skew >= 9);
  CHECK(primary_offset > replica_offset);  // the promoted replica lacks the last writes
  CHECK(failed_children == 0);
  CHECK(s30.after >= 40);
  CHECK(s1.after >= 40);
  CHECK(first_s(s30) > 0);
  CHECK(first_s(s30) < 12);  // measured: docs/redis.md's fault table
  CHECK(log->peak[0].load() <= 4);
  CHECK(log->peak[1].load() <= 4);
  CHECK(s30.duplicates + s1.duplicates == 0);
  CHECK(s30.order_violations + s1.order_violations == 0);
  ::munmap(log, sizeof(shared_log));
}
