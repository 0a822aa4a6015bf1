// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_EXAMPLES_SUPPORT_REDIS_SENTINEL_HPP
#define SLUICE_EXAMPLES_SUPPORT_REDIS_SENTINEL_HPP

// A private Sentinel deployment for a test (or an example): a primary, one
// replica and three redis-sentinel processes on free loopback ports, with a
// short down-after-milliseconds so that a failover takes a few seconds.
// Everything is killed (SIGKILL) when it is destroyed; its files live in a
// temporary directory removed then.

#include <sluice/asio.hpp>
#include <sluice/redis/sentinel.hpp>

#include "redis_server.hpp"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace sluice_examples {

// How the replica runs: `wrapper` starts it (e.g. {"env", "LD_PRELOAD=..."});
// `upstream(primary port)` is the port it replicates from (a relay), if set.
// `failover_timeout_ms`: the sentinels' failover-timeout, also how long they
// leave a replica that replicates from another address (the relay) before
// they point it at the primary, and half the wait before a failed election
// is tried again.
struct sentinel_replica_setup {
  std::vector<std::string> wrapper;
  std::function<int(int)> upstream;
  int failover_timeout_ms = 3000;
};

class redis_sentinels {
 public:
  // The master name the sentinels monitor.
  static constexpr const char* master = "mymaster";

  using replica_setup = sentinel_replica_setup;

  // Starts the deployment and waits until every sentinel knows the replica and
  // the two other sentinels (a failover needs both); nullopt, with the reason
  // in `why`, if it could not (no redis-sentinel, a process did not come up).
  static std::optional<redis_sentinels> start(std::string& why, int down_after_ms = 400,
                                              const replica_setup& rs = {}) {
    if (find_program("redis-sentinel").empty()) {
      why = "no redis-sentinel (Debian: redis-sentinel)";
      return std::nullopt;
    }
    redis_sentinels d;
    char tmpl[] = "/tmp/sluice-sentinel-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      why = "mkdtemp failed";
      return std::nullopt;
    }
    d.dir_ = tmpl;
    // --dir: the replica writes the RDB of its full sync there, not into the
    // caller's working directory.
    if (auto p = redis_server::start({}, {"--dir", d.dir_})) d.primary_.emplace(std::move(*p));
    if (!d.primary_) {
      why = "could not start redis-server";
      return std::nullopt;
    }
    const int upstream = rs.upstream ? rs.upstream(d.primary_->port()) : d.primary_->port();
    if (auto r = redis_server::start(
            {}, {"--replicaof", "127.0.0.1", std::to_string(upstream), "--dir", d.dir_},
            rs.wrapper))
      d.replica_.emplace(std::move(*r));
    if (!d.replica_ ||
        !d.wait_for(d.replica_->port(), "INFO", "replication", "master_link_status:up")) {
      why = "the replica did not sync";
      return std::nullopt;
    }
    for (int i = 0; i < 3; ++i) {
      if (!d.start_sentinel(down_after_ms, rs.failover_timeout_ms)) {
        why = "could not start redis-sentinel";
        return std::nullopt;
      }
    }
    for (int port : d.sentinel_ports_) {
      if (!d.wait_for(port, "SENTINEL", "REPLICAS", "*1\r\n") ||
          !d.wait_for(port, "SENTINEL", "SENTINELS", "*2\r\n")) {
        why = "the sentinels did not discover each other and the replica";
        return std::nullopt;
      }
    }
    return d;
  }

  // Starts it, or ends the test binary with skip_exit_code and the reason.
  static redis_sentinels start_or_skip(const replica_setup& rs = {}) {
    std::string why;
    auto d = start(why, 400, rs);
    if (!d) {
      std::fprintf(stderr, "SKIPPED: %s\n", why.c_str());
      std::fflush(stderr);
      std::_Exit(skip_exit_code);
    }
    return std::move(*d);
  }

  // The sentinels' ports as "p1,p2,p3" (a child process's argument).
  std::string ports_csv() const {
    std::string out;
    for (int p : sentinel_ports_) {  // appended in two steps: g++ 12 -O3 warned -Wrestrict on a + b
      if (!out.empty()) out += ',';
      out += std::to_string(p);
    }
    return out;
  }

  redis_sentinels(redis_sentinels&& o) noexcept
      : dir_(std::move(o.dir_)),
        primary_(std::move(o.primary_)),
        replica_(std::move(o.replica_)),
        sentinel_ports_(std::move(o.sentinel_ports_)),
        sentinel_pids_(std::move(o.sentinel_pids_)) {
    o.dir_.clear();
    o.sentinel_pids_.clear();
  }
  redis_sentinels& operator=(redis_sentinels&&) = delete;
  ~redis_sentinels() {
    for (pid_t pid : sentinel_pids_) {
      ::kill(pid, SIGKILL);
      wait_process(pid);
    }
    primary_.reset();
    replica_.reset();
    if (!dir_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
    }
  }

  const std::vector<int>& sentinel_ports() const { return sentinel_ports_; }
  int primary_port() const { return primary_ ? primary_->port() : -1; }
  int replica_port() const { return replica_->port(); }
  const std::string& dir() const { return dir_; }
  // SIGKILLs the primary (a crash): the sentinels then fail over to the replica.
  void kill_primary() { primary_.reset(); }
  // Freezes sentinel k (SIGSTOP: a hung process whose kernel still answers
  // TCP) / lets it go on.
  void pause_sentinel(std::size_t k) const { ::kill(sentinel_pids_.at(k), SIGSTOP); }
  void resume_sentinel(std::size_t k) const { ::kill(sentinel_pids_.at(k), SIGCONT); }

  // Sends one command (up to three words) in RESP to a loopback port and
  // returns the raw reply (up to 64 KiB), or "" on failure.
  static std::string raw(int port, const std::vector<std::string>& words) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback_address(port);
    std::string out;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      std::string cmd = "*" + std::to_string(words.size()) + "\r\n";
      for (const auto& w : words) cmd += "$" + std::to_string(w.size()) + "\r\n" + w + "\r\n";
      if (::write(fd, cmd.data(), cmd.size()) == static_cast<ssize_t>(cmd.size())) {
        timeval tv{1, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char buf[65536];
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n > 0) out.assign(buf, static_cast<std::size_t>(n));
      }
    }
    ::close(fd);
    return out;
  }

 private:
  redis_sentinels() = default;

  // Polls `cmd sub master-or-section` on `port` until the reply contains `want` (10 s).
  bool wait_for(int port, const std::string& cmd, const std::string& sub,
                const std::string& want) const {
    std::vector<std::string> words{cmd, sub};
    if (cmd == "SENTINEL") words.push_back(master);
    for (int i = 0; i < 200; ++i) {
      if (raw(port, words).find(want) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  bool start_sentinel(int down_after_ms, int failover_timeout_ms) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      const int port = free_port();
      const std::string conf = dir_ + "/sentinel-" + std::to_string(port) + ".conf";
      std::ofstream(conf) << "port " << port << "\nbind 127.0.0.1\ndaemonize no\n"
                          << "logfile \"\"\ndir " << dir_ << "\n"
                          << "sentinel monitor " << master << " 127.0.0.1 " << primary_->port()
                          << " 2\n"
                          << "sentinel down-after-milliseconds " << master << " " << down_after_ms
                          << "\nsentinel failover-timeout " << master << " " << failover_timeout_ms
                          << "\n"
                          << "sentinel parallel-syncs " << master << " 1\n";
      const pid_t pid = spawn_until_ping({"redis-sentinel", conf}, port, 300);
      if (pid > 0) {
        sentinel_ports_.push_back(port);
        sentinel_pids_.push_back(pid);
        return true;
      }
    }
    return false;
  }

  std::string dir_;
  std::optional<redis_server> primary_, replica_;
  std::vector<int> sentinel_ports_;
  std::vector<pid_t> sentinel_pids_;
};

// "p1,p2,p3" -> the sentinels on 127.0.0.1.
inline std::vector<sluice::redis::sentinel_address> sentinels_of(const std::string& ports) {
  std::vector<sluice::redis::sentinel_address> out;
  for (std::size_t i = 0; i < ports.size();) {
    const std::size_t j = std::min(ports.find(',', i), ports.size());
    out.push_back({"127.0.0.1", static_cast<std::uint16_t>(std::stoi(ports.substr(i, j - i)))});
    i = j + 1;
  }
  return out;
}

}  // namespace sluice_examples

#endif  // SLUICE_EXAMPLES_SUPPORT_REDIS_SENTINEL_HPP
