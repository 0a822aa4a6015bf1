// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_EXAMPLES_SUPPORT_REDIS_SERVER_HPP
#define SLUICE_EXAMPLES_SUPPORT_REDIS_SERVER_HPP

// A private redis-server for one example (or test, or benchmark): started on a
// free loopback port with no persistence (`--save "" --appendonly no`),
// waited for until it answers PING, stopped (SIGKILL) when destroyed. Also
// child processes: the program re-runs itself (/proc/self/exe) with
// `--child <name> args...` (its main() dispatches to child_roles(), as
// examples/fleet.cpp and tests/support/redis_main.cpp do), so that several
// processes share one server without fork() (unsafe under the sanitizers).
// Linux only (prctl, /proc). It ships beside the examples and includes no
// sluice header: copy it with the example that includes it.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace sluice_examples {

// Exit code of a program that could not start a redis-server (ctest's
// SKIP_RETURN_CODE for the redis tests and examples).
inline constexpr int skip_exit_code = 77;

// The path of `name` found on PATH (or `name` if it contains a slash); empty
// if there is none.
inline std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const std::size_t end = std::min(dirs.find(':', start), dirs.size());
    std::string candidate = dirs.substr(start, end - start) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return {};
}

// Starts `args` as a child process that dies with this one (PR_SET_PDEATHSIG:
// a crashed test leaves no server behind); `quiet`: stdout and stderr go to
// /dev/null (a server must not hold the test's output pipe open). Returns its
// pid, or -1. The child runs only async-signal-safe calls before execv.
inline pid_t spawn_process(const std::vector<std::string>& args, bool quiet = false) {
  const std::string program = find_program(args.at(0));
  if (program.empty()) return -1;
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    if (quiet) {
      const int null = ::open("/dev/null", O_RDWR);
      ::dup2(null, 1);
      ::dup2(null, 2);
    }
    ::execv(program.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

// Waits for `pid` and returns its exit status (128 + signal if killed).
inline int wait_process(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// 127.0.0.1:port as a socket address.
inline sockaddr_in loopback_address(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  return a;
}

// A loopback TCP port nobody listens on now.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback_address(0);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// True if a Redis server answers PING on 127.0.0.1:port (NOAUTH counts: it is up).
inline bool ping(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback_address(port);
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const char cmd[] = "*1\r\n$4\r\nPING\r\n";
    char buf[16] = {};
    if (::write(fd, cmd, sizeof cmd - 1) == static_cast<ssize_t>(sizeof cmd - 1) &&
        ::read(fd, buf, sizeof buf - 1) > 0)
      ok = std::strncmp(buf, "+PONG", 5) == 0 || std::strncmp(buf, "-NOAUTH", 7) == 0;
  }
  ::close(fd);
  return ok;
}

// The arguments of a redis-server on 127.0.0.1:`port` with no persistence
// and no log (more may follow; a later one overrides an earlier one).
inline std::vector<std::string> redis_server_args(int port) {
  return {"redis-server",
          "--port",
          std::to_string(port),
          "--bind",
          "127.0.0.1",
          "--save",
          "",
          "--appendonly",
          "no",
          "--daemonize",
          "no",
          "--loglevel",
          "warning",
          "--logfile",
          "/dev/null"};
}

// Starts `args` (quiet) and waits until a server answers PING on `port`
// (`tries` x 10 ms). Its pid, or -1 if it exited (the port was taken, bad
// arguments) or did not answer in time (then it is killed).
inline pid_t spawn_until_ping(const std::vector<std::string>& args, int port, int tries) {
  const pid_t pid = spawn_process(args, true);
  if (pid <= 0) return -1;
  for (int i = 0; i < tries; ++i) {
    if (ping(port)) return pid;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  wait_process(pid);
  return -1;
}

class redis_server {
 public:
  // Starts a server on a free port; nullopt if none could be started (no
  // redis-server binary, or it did not answer PING within 5 s).
  // `unix_socket`: also listen on that path.
  // `extra`: more redis-server arguments (e.g. {"--requirepass", "pw"}); they
  // come after the defaults, so they may override `--save` too.
  // `wrapper`: a command that runs the server (e.g. {"env", "LD_PRELOAD=x.so"}).
  static std::optional<redis_server> start(std::string unix_socket = {},
                                           std::vector<std::string> extra = {},
                                           std::vector<std::string> wrapper = {}) {
    redis_server s;
    s.unix_socket_ = std::move(unix_socket);
    s.extra_ = std::move(extra);
    s.wrapper_ = std::move(wrapper);
    for (int attempt = 0; attempt < 3; ++attempt) {
      s.port_ = free_port();
      if (s.port_ > 0 && s.launch()) return s;
    }
    return std::nullopt;
  }

  redis_server(redis_server&& o) noexcept
      : port_(o.port_),
        pid_(std::exchange(o.pid_, -1)),
        unix_socket_(std::move(o.unix_socket_)),
        extra_(std::move(o.extra_)),
        wrapper_(std::move(o.wrapper_)) {}
  redis_server& operator=(redis_server&&) = delete;
  ~redis_server() { stop(); }

  int port() const { return port_; }
  bool running() const { return pid_ > 0; }

  // Freezes the server (SIGSTOP: a stall, a partition) / lets it go on.
  void pause() const {
    if (pid_ > 0) ::kill(pid_, SIGSTOP);
  }
  void resume() const {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
  }

  // Kills the server (SIGKILL: no clean shutdown, as a crash) and waits for it.
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::kill(pid_, SIGCONT);  // a stopped process dies only once it runs
      wait_process(pid_);
      pid_ = -1;
    }
  }

  // Starts it again on the same port, with the same arguments: empty (no
  // persistence), or from its last RDB snapshot when `extra` gave it a `--dir`
  // and it was told to `SAVE`. False if it did not come up.
  bool restart() {
    stop();
    for (int attempt = 0; attempt < 50; ++attempt) {  // the port may linger briefly
      if (launch()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

 private:
  redis_server() = default;

  bool launch() {
    std::vector<std::string> args = redis_server_args(port_);
    if (!unix_socket_.empty()) {
      args.insert(args.end(), {"--unixsocket", unix_socket_, "--unixsocketperm", "700"});
    }
    args.insert(args.end(), extra_.begin(), extra_.end());
    args.insert(args.begin(), wrapper_.begin(), wrapper_.end());
    pid_ = spawn_until_ping(args, port_, 500);
    return pid_ > 0;
  }

  int port_ = -1;
  pid_t pid_ = -1;
  std::string unix_socket_;
  std::vector<std::string> extra_;
  std::vector<std::string> wrapper_;
};

// Child roles a test binary can run as: `<self> --child <name> args...`.
using child_main = std::function<int(const std::vector<std::string>&)>;
inline std::map<std::string, child_main>& child_roles() {
  static std::map<std::string, child_main> roles;
  return roles;
}
struct register_child {
  register_child(const std::string& name, child_main f) { child_roles()[name] = std::move(f); }
};

// Starts this binary as child `name` with `args`; returns its pid.
inline pid_t spawn_child(const std::string& name, const std::vector<std::string>& args) {
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return -1;
  std::vector<std::string> argv = {std::string(self, static_cast<std::size_t>(n)), "--child", name};
  argv.insert(argv.end(), args.begin(), args.end());
  return spawn_process(argv);
}

}  // namespace sluice_examples

#endif  // SLUICE_EXAMPLES_SUPPORT_REDIS_SERVER_HPP
