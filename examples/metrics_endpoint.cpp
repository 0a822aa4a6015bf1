// SPDX-License-Identifier: BSL-1.0
// Every limit's stats() in Prometheus text format over HTTP (Boost.Beast), no
// metrics library: GET /metrics renders one snapshot of each limit.
//
// A known workload runs first: 20 provider calls (100 ms each, scaled by
// --scale in real time) for 4 accounts, each under a per-account limit (one
// call per account at once), a process-wide shared_semaphore{8} and a
// backend semaphore{4}; 8 rate-limiter try_acquire()s against a quota of 5 per
// hour; 5 token-bucket try_acquire()s against a burst of 3; and a lock held
// for 200 ms while two callers give up waiting for it after 10 ms, then one
// that waits.
//
//   metrics_endpoint [--port 0] [--scale 0.2]
//       runs the workload in real time, prints "listening on http://127.0.0.1:<port>/metrics"
//       and, when the workload is done, "workload done"; serves until SIGINT/SIGTERM
//   metrics_endpoint --virtual
//       runs the workload in virtual time, prints the metrics, and checks every
//       value of them against the workload (durations exact); exit 1 if one differs
//   metrics_endpoint --redis-port 6379 [--port 0] [--scale 0.2]
//       (built with sluice::redis) also exports two fleet-wide limits on that
//       Redis server: after the workload above, 4 calls under a
//       redis::semaphore{2} (100 ms each, scaled) and 5 try_acquire()s of a
//       redis::rate_limiter{3 per hour}. Their stats() are this process's view;
//       a fleet sums them over its processes.
//
// tests/load/metrics_endpoint_scrape.py (CTest `metrics_endpoint_scrape`, and
// `metrics_endpoint_scrape_redis` with a redis-server it starts) starts it and
// scrapes it with curl.

#ifndef SLUICE_USE_BOOST_ASIO
#error \
    "metrics_endpoint uses Boost.Beast: build it with SLUICE_USE_BOOST_ASIO (examples/CMakeLists.txt does)"
#endif

#include <sluice/sluice.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>

#include <sluice/asio.hpp>

#ifdef SLUICE_EXAMPLE_WITH_REDIS
#include <sluice/redis/rate_limiter.hpp>
#include <sluice/redis/semaphore.hpp>
#endif

#include "support/http_server.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace http = boost::beast::http;
using namespace std::chrono_literals;

// The limits of the workload, each exported under its name.
struct limits {
  explicit limits(const asio::any_io_executor& ex)
      : backend(ex, 4), rpm(ex, 5, 1h), burst(ex, 0.001, 3), process_cap(ex, 8) {}
  sluice::semaphore backend;
  sluice::lock config;
  sluice::rate_limiter rpm;
  sluice::token_bucket burst;
  sluice::shared_semaphore process_cap;
  sluice::keyed_semaphore<std::string> per_account{1};
};

// A limit's name and how to read its stats.
struct exported {
  std::string name;
  std::function<sluice::stats()> read;
};

// clang-format off
std::vector<exported> registry(limits& l) {
  return {{"backend", [&l] { return l.backend.stats(); }},
          {"config", [&l] { return l.config.stats(); }},
          {"rpm", [&l] { return l.rpm.stats(); }},
          {"burst", [&l] { return l.burst.stats(); }},
          {"process_cap", [&l] { return l.process_cap.stats(); }},
          {"per_account", [&l] { return l.per_account.stats(); }}};
}
// clang-format on

double seconds(std::chrono::nanoseconds d) {
  return std::chrono::duration<double>(d).count();
}

// The Prometheus text exposition format (version 0.0.4): counters, gauges,
// and the waits and holds as summaries (quantiles 0.5 and 0.99, _sum, _count).
std::string prometheus(const std::vector<exported>& limits) {
  std::vector<std::pair<std::string, sluice::stats>> snap;
  for (const auto& l : limits) snap.emplace_back(l.name, l.read());
  std::ostringstream out;
  out.precision(9);
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
    for (const auto& [limit, s] : snap)
      out << name << "{limit=\"" << limit << "\"} " << value(s) << '\n';
  };
  family("sluice_acquired_total", "counter", "Grants so far.",
         [](const sluice::stats& s) { return s.acquired; });
  family("sluice_cancelled_total", "counter", "Waits that ended cancelled.",
         [](const sluice::stats& s) { return s.cancelled; });
  family("sluice_throttled_total", "counter", "Requests a rate limit delayed or refused.",
         [](const sluice::stats& s) { return s.throttled; });
  family("sluice_waiting", "gauge", "Operations waiting now.",
         [](const sluice::stats& s) { return s.waiting; });
  family("sluice_in_use", "gauge", "Permits held (units taken) now.",
         [](const sluice::stats& s) { return s.in_use; });
  family("sluice_limit", "gauge", "The cap now.", [](const sluice::stats& s) { return s.limit; });
  auto summary = [&](const char* name, const char* help, auto pick) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " summary\n";
    for (const auto& [limit, s] : snap) {
      const sluice::duration_stats& d = pick(s);
      out << name << "{limit=\"" << limit << "\",quantile=\"0.5\"} " << seconds(d.p50) << '\n'
          << name << "{limit=\"" << limit << "\",quantile=\"0.99\"} " << seconds(d.p99) << '\n'
          << name << "_sum{limit=\"" << limit << "\"} " << seconds(d.total) << '\n'
          << name << "_count{limit=\"" << limit << "\"} " << d.count << '\n';
    }
  };
  summary("sluice_wait_seconds", "From the request to its grant.",
          [](const sluice::stats& s) -> const sluice::duration_stats& { return s.wait; });
  summary("sluice_hold_seconds", "From a permit's grant to its release.",
          [](const sluice::stats& s) -> const sluice::duration_stats& { return s.hold; });
  return out.str();
}

// One provider call under the three limits that cap it.
asio::awaitable<void> call(limits& l, sluice::testing::slow_service& api, std::string account) {
  auto one_per_account = co_await l.per_account.scoped_acquire(account);
  auto in_process = co_await l.process_cap.scoped_acquire();
  auto backend = co_await l.backend.scoped_acquire();
  co_await api.call(account);
}

asio::awaitable<void> hold_config(limits& l, std::chrono::milliseconds d) {
  auto guard = co_await l.config.scoped_acquire();
  co_await sluice::sleep(d);
}

asio::awaitable<void> give_up_on_config(limits& l) {
  try {
    co_await sluice::with_timeout(10ms, l.config.acquire());
    l.config.release();
  } catch (const sluice::timeout_error&) {
  }
}

asio::awaitable<void> wait_for_config(limits& l) {
  co_await sluice::sleep(20ms);
  auto guard = co_await l.config.scoped_acquire();
}

// The workload whose numbers the metrics show.
asio::awaitable<void> workload(limits& l, sluice::testing::slow_service& api) {
  std::vector<asio::awaitable<void>> calls;
  for (int i = 0; i < 20; ++i) calls.push_back(call(l, api, "acct-" + std::to_string(i % 4)));
  calls.push_back(hold_config(l, 200ms));
  calls.push_back(give_up_on_config(l));
  calls.push_back(give_up_on_config(l));
  calls.push_back(wait_for_config(l));
  co_await sluice::gather(std::move(calls));
  for (int i = 0; i < 8; ++i) (void)l.rpm.try_acquire();    // 5 fit in the hour's quota
  for (int i = 0; i < 5; ++i) (void)l.burst.try_acquire();  // 3 fit in the burst
}

// GET /metrics: every exported limit's stats; anything else is a 404.
asio::awaitable<sluice_examples::http_response> answer(const sluice_examples::http_request& req,
                                                       const std::vector<exported>& limits) {
  sluice_examples::http_response res{http::status::ok, req.version()};
  if (req.method() == http::verb::get && req.target() == "/metrics") {
    res.set(http::field::content_type, "text/plain; version=0.0.4");
    res.body() = prometheus(limits);
  } else {
    res.result(http::status::not_found);
    res.body() = "GET /metrics\n";
  }
  co_return res;
}

#ifdef SLUICE_EXAMPLE_WITH_REDIS
// Two limits shared by every process on the same Redis server and names.
struct fleet_limits {
  explicit fleet_limits(std::shared_ptr<sluice::redis::connection> c)
      : conn(std::move(c)),
        cap(conn, "metrics-example", 2, std::chrono::seconds(10)),
        rpm(conn, "metrics-example:rpm", 3, std::chrono::hours(1)) {}
  // Releases what is held, stops the semaphore's connections.
  asio::awaitable<void> close() {
    co_await cap.close();
    co_await conn->close();
  }
  std::shared_ptr<sluice::redis::connection> conn;
  sluice::redis::semaphore cap;
  sluice::redis::rate_limiter rpm;
};

asio::awaitable<void> fleet_call(fleet_limits& f, sluice::testing::slow_service& api) {
  auto permit = co_await f.cap.scoped_acquire();  // at most 2 across the fleet
  co_await api.call("fleet");
}

// Connects, adds the fleet's limits to the exported ones, runs their workload.
asio::awaitable<void> fleet_workload(unsigned short redis_port, std::unique_ptr<fleet_limits>& f,
                                     std::vector<exported>& limits,
                                     sluice::testing::slow_service& api) {
  auto conn =
      co_await sluice::redis::connect(co_await asio::this_coro::executor, "127.0.0.1", redis_port);
  f = std::make_unique<fleet_limits>(conn);
  limits.push_back({"fleet_cap", [p = f.get()] {
                      return p->cap.stats();
                    }});
  limits.push_back({"fleet_rpm", [p = f.get()] {
                      return p->rpm.stats();
                    }});
  std::vector<asio::awaitable<void>> calls;
  for (int i = 0; i < 4; ++i) calls.push_back(fleet_call(*f, api));
  co_await sluice::gather(std::move(calls));
  for (int i = 0; i < 5; ++i) (void)co_await f->rpm.try_acquire();  // 3 fit in the hour
}
#endif

// --virtual: the workload in virtual time, its metrics checked value by value.
int run_virtual() {
  sluice::testing::virtual_loop loop;
  limits l(loop.get_executor());
  sluice::testing::slow_service api({.latency = sluice::testing::latency::fixed(100ms)});
  loop.run(workload(l, api));
  const std::string text = prometheus(registry(l));
  std::cout << text;
  // The lines the workload must produce (the hold sums are exact in virtual time).
  const char* expected[] = {
      "sluice_acquired_total{limit=\"backend\"} 20",
      "sluice_acquired_total{limit=\"per_account\"} 20",
      "sluice_acquired_total{limit=\"process_cap\"} 20",
      "sluice_acquired_total{limit=\"config\"} 2",
      "sluice_cancelled_total{limit=\"config\"} 2",
      "sluice_acquired_total{limit=\"rpm\"} 5",
      "sluice_throttled_total{limit=\"rpm\"} 3",
      "sluice_acquired_total{limit=\"burst\"} 3",
      "sluice_throttled_total{limit=\"burst\"} 2",
      "sluice_in_use{limit=\"rpm\"} 5",
      "sluice_in_use{limit=\"backend\"} 0",
      "sluice_limit{limit=\"backend\"} 4",
      "sluice_limit{limit=\"process_cap\"} 8",
      "sluice_hold_seconds_sum{limit=\"backend\"} 2",
      "sluice_hold_seconds_count{limit=\"backend\"} 20",
      "sluice_hold_seconds{limit=\"backend\",quantile=\"0.99\"} 0.1",
      "sluice_hold_seconds_sum{limit=\"config\"} 0.2",
      "sluice_wait_seconds_count{limit=\"per_account\"} 20",
      // 5 calls per account, 100 ms each, one at a time: waits 0, 0.1, ..., 0.4 s per account.
      "sluice_wait_seconds_sum{limit=\"per_account\"} 4",
      "sluice_wait_seconds_sum{limit=\"config\"} 0.18",
      "sluice_hold_seconds_count{limit=\"per_account\"} 20",
  };
  int bad = 0;
  for (const char* line : expected) {
    if (text.find(std::string(line) + "\n") == std::string::npos) {
      std::cerr << "metrics_endpoint --virtual: missing \"" << line << "\"\n";
      ++bad;
    }
  }
  if (loop.now() != 500ms) {
    std::cerr << "metrics_endpoint --virtual: the workload took "
              << std::chrono::duration<double>(loop.now()).count() << " s, expected 0.5 s\n";
    ++bad;
  }
  return bad == 0 ? 0 : 1;
}

int run_real(unsigned short port, double scale, [[maybe_unused]] unsigned short redis_port) {
  asio::io_context ctx;
  limits l(ctx.get_executor());
  auto exported_limits = registry(l);
  sluice::testing::slow_service api(
      {.latency = sluice::testing::latency::fixed(100ms), .time_scale = scale});
  sluice_examples::http_server server(ctx, port, [&](const sluice_examples::http_request& req) {
    return answer(req, exported_limits);
  });
  std::cout << "metrics_endpoint: listening on http://127.0.0.1:" << server.port() << "/metrics"
            << std::endl;
#ifdef SLUICE_EXAMPLE_WITH_REDIS
  std::unique_ptr<fleet_limits> fleet;  // destroyed before ctx
#endif
  auto all = [&]() -> asio::awaitable<void> {
    co_await workload(l, api);
#ifdef SLUICE_EXAMPLE_WITH_REDIS
    if (redis_port != 0) co_await fleet_workload(redis_port, fleet, exported_limits, api);
#endif
  };
  asio::co_spawn(ctx, all(), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
    std::cout << "metrics_endpoint: workload done" << std::endl;
  });
  server.stop_on_signals([&] {
#ifdef SLUICE_EXAMPLE_WITH_REDIS
    if (fleet) {
      asio::co_spawn(ctx, fleet->close(), [&](std::exception_ptr) { ctx.stop(); });
      return;
    }
#endif
    ctx.stop();
  });
  server.run(1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  unsigned short port = 0;
  unsigned short redis_port = 0;
  double scale = 0.2;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--virtual") return run_virtual();
    if (a == "--port" && i + 1 < argc) {
      port = static_cast<unsigned short>(std::atoi(argv[++i]));
    } else if (a == "--scale" && i + 1 < argc) {
      scale = std::atof(argv[++i]);
#ifdef SLUICE_EXAMPLE_WITH_REDIS
    } else if (a == "--redis-port" && i + 1 < argc) {
      redis_port = static_cast<unsigned short>(std::atoi(argv[++i]));
#endif
    } else {
      std::cerr << "usage: metrics_endpoint [--port N] [--scale S] [--redis-port N] | --virtual\n";
      return 2;
    }
  }
  try {
    return run_real(port, scale, redis_port);
  } catch (const std::exception& e) {
    std::cerr << "metrics_endpoint: " << e.what() << '\n';
    return 1;
  }
}
