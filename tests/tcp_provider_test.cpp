// SPDX-License-Identifier: BSL-1.0
// sluice against a real slow provider over TCP on loopback: the server
// (tests/support/slow_server.hpp) runs in a child process, so this process's
// /proc/self/fd counts only the client's sockets. One connection per request:
// a fan-out without a bound shows up as descriptors and throttles.

#include <sluice/acquire_all.hpp>
#include <sluice/gather.hpp>
#include <sluice/outcome.hpp>
#include <sluice/rate_limiter.hpp>
#include <sluice/semaphore.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <examples/support/slow_server.hpp>

#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

// Sanitizers need a free descriptor to check memory (a pipe), so a process
// out of descriptors gets false reports: there the unbounded run shows the
// throttles (600 requests at once) instead of running out of descriptors.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif
#else
constexpr bool sanitized = false;
#endif

// The server in a child process on a free loopback port; killed on destruction.
class server_process {
 public:
  explicit server_process(sluice_examples::server_options o) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::close(fds[0]);
      asio::io_context ctx;
      sluice_examples::slow_server srv(ctx, std::move(o));
      srv.start();
      const unsigned short port = srv.port();
      if (::write(fds[1], &port, sizeof port) != sizeof port) ::_exit(1);
      ::close(fds[1]);
      ctx.run();
      ::_exit(0);
    }
    ::close(fds[1]);
    REQUIRE(::read(fds[0], &port_, sizeof port_) == sizeof port_);
    ::close(fds[0]);
  }
  server_process(const server_process&) = delete;
  server_process& operator=(const server_process&) = delete;
  ~server_process() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  unsigned short port() const { return port_; }

 private:
  pid_t pid_ = -1;
  unsigned short port_ = 0;
};

// Open descriptors of this process (the directory's own is not counted).
std::size_t open_fds() {
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++n;
  }
  return n - 1;
}

// Lowers RLIMIT_NOFILE for its lifetime.
class fd_limit {
 public:
  explicit fd_limit(rlim_t soft) {
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved_) == 0);
    rlimit l = saved_;
    l.rlim_cur = soft;
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &l) == 0);
  }
  fd_limit(const fd_limit&) = delete;
  fd_limit& operator=(const fd_limit&) = delete;
  ~fd_limit() { ::setrlimit(RLIMIT_NOFILE, &saved_); }

 private:
  rlimit saved_{};
};

struct tally : sluice_examples::reply_tally {
  std::size_t baseline = 0;  // descriptors open before the first request (loop included)
  std::size_t max_fds = 0;
};

// `n` requests over 20 keys, bounded by `limit` (0: unbounded gather), while
// a sampler counts /proc/self/fd every 200 us and after every request.
tally fan_out(unsigned short port, std::size_t n, std::size_t limit) {
  asio::io_context ctx;
  tally t;
  t.baseline = open_fds();
  bool running = true;
  auto sample = [&] {
    t.max_fds = std::max(t.max_fds, open_fds());
  };
  auto one = [&](std::size_t i) -> asio::awaitable<std::string> {
    std::string reply = co_await sluice_examples::request(port, "GET k" + std::to_string(i % 20));
    sample();
    co_return reply;
  };
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        asio::steady_timer timer(co_await asio::this_coro::executor);
        while (running) {
          sample();
          timer.expires_after(200us);
          co_await timer.async_wait(asio::use_awaitable);
        }
      },
      asio::detached);
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        std::vector<asio::awaitable<std::string>> tasks;
        for (std::size_t i = 0; i < n; ++i) tasks.push_back(one(i));
        // (Two statements: g++ 12 miscompiles co_await in both arms of ?:.)
        std::vector<sluice::outcome<std::string>> r;
        if (limit == 0) {
          r = co_await sluice::gather(std::move(tasks), sluice::return_exceptions);
        } else {
          r = co_await sluice::gather_with_concurrency(limit, std::move(tasks),
                                                       sluice::return_exceptions);
        }
        running = false;
        t.add(r);
      },
      asio::detached);
  ctx.run();
  return t;
}

// The server's counters, through its STATS request.
std::size_t stat(unsigned short port, const std::string& name) {
  asio::io_context ctx;
  std::string line;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> { line = co_await sluice_examples::request(port, "STATS"); },
      asio::detached);
  ctx.run();
  const auto at = line.find(name + "=");
  REQUIRE(at != std::string::npos);
  return std::stoul(line.substr(at + name.size() + 1));
}

sluice_examples::server_options provider() {
  sluice_examples::server_options o;
  o.latency = [](std::string_view, std::size_t i) {
    return std::chrono::milliseconds(1 + i % 3);
  };
  o.throttle_above = 60;  // the provider's concurrency limit
  return o;
}

}  // namespace

TEST_CASE("2,000 requests at limit 50 keep at most 50 sockets open and are never throttled",
          "[tcp]") {
  server_process server(provider());
  const tally t = fan_out(server.port(), 2000, 50);
  const std::size_t baseline = t.baseline;
  std::printf("limit 50: ok %zu throttled %zu failed %zu, max fds %zu over a baseline of %zu\n",
              t.ok, t.throttled, t.failed, t.max_fds - baseline, baseline);
  INFO("first failure: " << t.first_failure);
  CHECK(t.ok == 2000);
  CHECK(t.throttled == 0);
  CHECK(t.failed == 0);
  CHECK(t.max_fds > baseline + 25);  // the sampler saw the fan-out...
  // ...and never more than the bound, plus the epoll, eventfd and timerfd
  // the loop's reactor opens on first use.
  CHECK(t.max_fds <= baseline + 50 + 3);
  CHECK(stat(server.port(), "max_concurrent") <= 50);
  CHECK(stat(server.port(), "throttled") == 0);
  CHECK(stat(server.port(), "requests") == 2000);
}

TEST_CASE("the same run unbounded runs out of descriptors or is throttled; the bound fixes it",
          "[tcp]") {
  const std::size_t baseline = open_fds();
  tally unbounded, bounded;
  std::size_t unbounded_throttles = 0, bounded_max = 0, bounded_throttles = 0;
  {
    server_process server(provider());
    if (sanitized) {
      unbounded = fan_out(server.port(), 600, 0);
    } else {
      fd_limit low(baseline + 150);
      unbounded = fan_out(server.port(), 2000, 0);
    }
    unbounded_throttles = stat(server.port(), "throttled");
  }
  {
    server_process server(provider());
    {
      fd_limit low(baseline + 150);
      bounded = fan_out(server.port(), 2000, 50);
    }
    bounded_max = stat(server.port(), "max_concurrent");
    bounded_throttles = stat(server.port(), "throttled");
  }
  std::printf(
      "RLIMIT_NOFILE %zu: unbounded ok %zu throttled %zu failed %zu (%s); limit 50 ok %zu "
      "throttled %zu, server max concurrent %zu\n",
      baseline + 150, unbounded.ok, unbounded.throttled, unbounded.failed,
      unbounded.first_failure.c_str(), bounded.ok, bounded.throttled, bounded_max);
  INFO("unbounded: ok " << unbounded.ok << " throttled " << unbounded.throttled << " failed "
                        << unbounded.failed << " (" << unbounded.first_failure << ")");
  CHECK(unbounded.ok < (sanitized ? 600u : 2000u));
  CHECK(unbounded.failed + unbounded.throttled > 0);
  CHECK(unbounded.throttled == unbounded_throttles);
  if (!sanitized) CHECK(unbounded.max_fds <= baseline + 150);
  CHECK(bounded.ok == 2000);
  CHECK(bounded.failed == 0);
  CHECK(bounded.throttled == 0);
  CHECK(bounded_throttles == 0);
  CHECK(bounded_max <= 50);
}

TEST_CASE("a rate_limiter at the provider's published quota is never throttled over real TCP",
          "[tcp][rate_limiter]") {
  // The provider publishes 500 requests per rolling second and counts a
  // request when it arrives; the client's rate_limiter is configured with
  // exactly that quota, beside 50 in flight, both taken by acquire_all. In
  // real time a start counts from its call's completion (the all_held's end)
  // plus a 1% margin. Counted from the grant instead, as in virtual time,
  // about 105 of the 2,000 calls were throttled (the first window's requests
  // travel longer than the ones that reuse their places).
  constexpr std::size_t calls = 2000, quota = 500;
  constexpr auto window = 1s;
  sluice_examples::server_options o;
  o.latency = [](std::string_view, std::size_t) {
    return std::chrono::milliseconds(1);
  };
  o.calls_per_window = quota;
  o.window = window;
  server_process server(o);

  asio::io_context ctx;
  sluice::semaphore in_flight{ctx.get_executor(), 50};
  sluice::rate_limiter rate{ctx.get_executor(), quota, window};
  sluice_examples::reply_tally t;
  const auto port = server.port();
  const auto t0 = std::chrono::steady_clock::now();
  auto last_start = t0;
  auto one = [&](std::size_t i) -> asio::awaitable<std::string> {
    auto held = co_await sluice::acquire_all(in_flight, rate);
    last_start = std::max(last_start, held.get<1>().at);
    co_return co_await sluice_examples::request(port, "GET k" + std::to_string(i % 20));
  };
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        std::vector<asio::awaitable<std::string>> tasks;
        for (std::size_t i = 0; i < calls; ++i) tasks.push_back(one(i));
        t.add(co_await sluice::gather(std::move(tasks), sluice::return_exceptions));
      },
      asio::detached);
  ctx.run();
  const auto secs = [t0](std::chrono::steady_clock::time_point x) {
    return std::chrono::duration<double>(x - t0).count();
  };
  const double makespan = secs(std::chrono::steady_clock::now()), last = secs(last_start);
  // The quota's bound: the last of 2,000 starts cannot come before 3 windows.
  const double bound =
      std::chrono::duration<double>(window).count() * static_cast<double>((calls - 1) / quota);
  std::printf(
      "rate_limiter{%zu, 1s} over TCP: ok %zu throttled %zu failed %zu; last start %.3f s, "
      "makespan %.3f s, the quota's bound %.3f s (last start +%.2f%%, makespan +%.2f%%)\n",
      quota, t.ok, t.throttled, t.failed, last, makespan, bound, 100.0 * (last - bound) / bound,
      100.0 * (makespan - bound) / bound);
  INFO("first failure: " << t.first_failure);
  CHECK(t.failed == 0);
  CHECK(t.throttled == 0);
  CHECK(t.ok == calls);
  CHECK(stat(server.port(), "throttled") == 0);
  CHECK(stat(server.port(), "requests") == calls);
}
