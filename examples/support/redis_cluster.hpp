// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_EXAMPLES_SUPPORT_REDIS_CLUSTER_HPP
#define SLUICE_EXAMPLES_SUPPORT_REDIS_CLUSTER_HPP

// A private Redis Cluster for one test (or example): `nodes` primaries
// (`redis-server --cluster-enabled yes`, no persistence, each with its
// nodes.conf in a temporary directory) on free loopback ports whose cluster
// bus ports (port + 10000) are free too, joined by `redis-cli --cluster
// create --cluster-yes`, waited for until every node says cluster_state:ok.
// Killed (SIGKILL) and its directory removed when destroyed.

#include <sluice/asio.hpp>
#include <sluice/redis/connection.hpp>

#include "redis_run.hpp"
#include "redis_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace sluice_examples {

// True if nobody listens on 127.0.0.1:port and it can be bound now.
inline bool port_bindable(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback_address(port);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// The output of a shell command (stdout), or nullopt if it failed.
inline std::optional<std::string> shell_output(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return std::nullopt;
  std::string out;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  if (rc != 0) return std::nullopt;
  return out;
}

class redis_cluster {
 public:
  static std::optional<redis_cluster> start(int nodes = 3) {
    if (find_program("redis-server").empty() || find_program("redis-cli").empty())
      return std::nullopt;
    redis_cluster c;
    char tmpl[] = "/tmp/sluice-cluster-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return std::nullopt;
    c.dir_ = tmpl;
    for (int i = 0; i < nodes; ++i)
      if (!c.launch_one()) return std::nullopt;
    std::string create = "redis-cli --cluster create";
    for (int p : c.ports_) create += " 127.0.0.1:" + std::to_string(p);
    create += " --cluster-yes >/dev/null 2>&1";
    if (!shell_output(create)) return std::nullopt;
    for (int i = 0; i < 200; ++i) {
      bool ok = true;
      for (int p : c.ports_) {
        auto info = shell_output("redis-cli -p " + std::to_string(p) + " cluster info");
        ok = ok && info && info->find("cluster_state:ok") != std::string::npos;
      }
      if (ok) return c;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return std::nullopt;
  }

  redis_cluster(redis_cluster&& o) noexcept
      : ports_(std::move(o.ports_)), pids_(std::move(o.pids_)), dir_(std::move(o.dir_)) {
    o.pids_.clear();
    o.dir_.clear();
  }
  redis_cluster& operator=(redis_cluster&&) = delete;
  ~redis_cluster() {
    for (pid_t pid : pids_) {
      ::kill(pid, SIGKILL);
      ::kill(pid, SIGCONT);
      wait_process(pid);
    }
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  const std::vector<int>& ports() const { return ports_; }
  const std::string& dir() const { return dir_; }

 private:
  redis_cluster() = default;

  bool launch_one() {
    for (int attempt = 0; attempt < 20; ++attempt) {
      const int port = free_port();
      if (port <= 0 || port > 55000 || !port_bindable(port + 10000)) continue;
      const std::string d = dir_ + "/" + std::to_string(port);
      std::filesystem::create_directories(d);
      std::vector<std::string> args = redis_server_args(port);
      args.insert(args.end(), {"--cluster-enabled", "yes", "--cluster-config-file",
                               d + "/nodes.conf", "--cluster-node-timeout", "5000", "--dir", d});
      const pid_t pid = spawn_until_ping(args, port, 300);
      if (pid > 0) {
        ports_.push_back(port);
        pids_.push_back(pid);
        return true;
      }
    }
    return false;
  }

  std::vector<int> ports_;
  std::vector<pid_t> pids_;
  std::string dir_;
};

// Starts a cluster, or ends the test binary with skip_exit_code and a message.
inline redis_cluster cluster_or_skip(int nodes = 3) {
  auto c = redis_cluster::start(nodes);
  if (!c) {
    std::fprintf(stderr,
                 "SKIPPED: could not start a Redis Cluster (redis-server with cluster support "
                 "and redis-cli; Debian: redis-server, redis-tools)\n");
    std::fflush(stderr);
    std::_Exit(skip_exit_code);
  }
  return std::move(*c);
}

// The port of the node serving `slot`, as the node at `port` sees it; -1 if none.
inline asio::awaitable<int> owner_port(int port, int slot) {
  auto c = co_await connect_to(port);
  sluice::redis::reply r = co_await c->execute("CLUSTER", "SLOTS");
  co_await c->close();
  for (const auto& e : r.elements)
    if (e.elements.at(0).integer <= slot && slot <= e.elements.at(1).integer)
      co_return static_cast<int>(e.elements.at(2).elements.at(1).integer);
  co_return -1;
}

// A port of `ports` other than `not_this`.
inline int other_port(const std::vector<int>& ports, int not_this) {
  for (int p : ports)
    if (p != not_this) return p;
  return -1;
}

// Moves one slot between two nodes as an operator (or redis-cli --cluster
// reshard) does, in three steps a test can interleave with its clients:
// begin (SETSLOT IMPORTING on the target, MIGRATING on the source: ASK and
// TRYAGAIN from now on), move_keys (MIGRATE ... KEYS, `batch` keys a call),
// finish (SETSLOT NODE on the target, the source, then the others: MOVED).
struct migration {
  std::shared_ptr<sluice::redis::connection> src, dst;
  std::string src_id, dst_id;
  std::vector<int> ports;
  int slot = 0;
  int to = 0;

  static asio::awaitable<migration> begin(int slot, int from, int to, std::vector<int> ports) {
    migration m;
    m.slot = slot;
    m.to = to;
    m.ports = std::move(ports);
    m.src = co_await connect_to(from);
    m.dst = co_await connect_to(to);
    m.src_id = (co_await m.src->execute("CLUSTER", "MYID")).str;
    m.dst_id = (co_await m.dst->execute("CLUSTER", "MYID")).str;
    const std::string s = std::to_string(slot);
    co_await m.dst->execute("CLUSTER", "SETSLOT", s, "IMPORTING", m.src_id);
    co_await m.src->execute("CLUSTER", "SETSLOT", s, "MIGRATING", m.dst_id);
    co_return m;
  }

  asio::awaitable<void> move_keys(int batch = 1000) const {
    for (;;) {
      sluice::redis::reply keys = co_await src->execute(
          "CLUSTER", "GETKEYSINSLOT", std::to_string(slot), std::to_string(batch));
      if (keys.elements.empty()) co_return;
      std::vector<std::string> cmd{"MIGRATE", "127.0.0.1", std::to_string(to), "", "0",
                                   "5000",    "KEYS"};
      for (const auto& k : keys.elements) cmd.push_back(k.str);
      co_await src->execute(std::move(cmd));
    }
  }

  asio::awaitable<void> finish() const {
    const std::string s = std::to_string(slot);
    co_await dst->execute("CLUSTER", "SETSLOT", s, "NODE", dst_id);
    co_await src->execute("CLUSTER", "SETSLOT", s, "NODE", dst_id);
    for (int p : ports) {
      auto c = co_await connect_to(p);
      const std::string id = (co_await c->execute("CLUSTER", "MYID")).str;
      if (id != src_id && id != dst_id)
        co_await c->execute("CLUSTER", "SETSLOT", s, "NODE", dst_id);
      co_await c->close();
    }
    co_await src->close();
    co_await dst->close();
  }
};

}  // namespace sluice_examples

#endif  // SLUICE_EXAMPLES_SUPPORT_REDIS_CLUSTER_HPP
