// SPDX-License-Identifier: BSL-1.0
// 10,000 requests to a real slow provider over TCP, one connection each, with
// gather_with_concurrency(100, ...): the bound is what keeps the process at
// 100 open sockets instead of 10,000 (and the provider below its throttle).
// Without --port it starts the server (examples/support/slow_server.hpp) in
// this process, on its own thread and io_context.
//
//   fanout_client [--port P] [--requests 10000] [--limit 100] [--keys 50]
//   fanout_client --unbounded     the same with sluice::gather: watch it fail
//   fanout_client --virtual       a short run (300 requests, limit 20)

#include <sluice/asio.hpp>
#include <sluice/gather.hpp>
#include <sluice/outcome.hpp>

#include "support/slow_server.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

struct options {
  unsigned short port = 0;  // 0: start the server here
  std::size_t requests = 10000, limit = 100, keys = 50;
  bool unbounded = false;
};

struct result : sluice_examples::reply_tally {
  sluice_examples::client_sockets sockets;
};

asio::awaitable<void> fan_out(const options& o, unsigned short port, result& r) {
  std::vector<asio::awaitable<std::string>> calls;
  for (std::size_t i = 0; i < o.requests; ++i)
    calls.push_back(
        sluice_examples::request(port, "GET key" + std::to_string(i % o.keys), &r.sockets));
  std::vector<sluice::outcome<std::string>> replies;
  if (o.unbounded) {
    replies = co_await sluice::gather(std::move(calls), sluice::return_exceptions);
  } else {
    replies = co_await sluice::gather_with_concurrency(o.limit, std::move(calls),
                                                       sluice::return_exceptions);
  }
  r.add(replies);
}

}  // namespace

int main(int argc, char** argv) try {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--virtual") {
      o.requests = 300;
      o.limit = 20;
      o.keys = 10;
    } else if (a == "--unbounded") {
      o.unbounded = true;
    } else if (i + 1 < argc) {
      const auto v = std::strtoul(argv[++i], nullptr, 10);
      if (a == "--port") o.port = static_cast<unsigned short>(v);
      if (a == "--requests") o.requests = v;
      if (a == "--limit") o.limit = v;
      if (a == "--keys") o.keys = v;
    }
  }

  // The provider: given, or started here on its own thread.
  asio::io_context server_ctx;
  std::optional<sluice_examples::slow_server> server;
  std::thread server_thread;
  unsigned short port = o.port;
  if (port == 0) {
    sluice_examples::server_options so;
    so.latency = [](std::string_view, std::size_t i) {
      return std::chrono::milliseconds(2 + static_cast<long>(i % 7));
    };
    so.throttle_above = 2 * o.limit;  // the provider tolerates twice our bound
    server.emplace(server_ctx, so);
    server->start();
    port = server->port();
    server_thread = std::thread([&] { server_ctx.run(); });
  }

  std::printf("%zu requests to 127.0.0.1:%u over %zu keys, %s\n", o.requests,
              static_cast<unsigned>(port), o.keys,
              o.unbounded ? "unbounded (sluice::gather)"
                          : ("gather_with_concurrency(" + std::to_string(o.limit) + ")").c_str());
  result r;
  asio::io_context ctx;
  const auto t0 = std::chrono::steady_clock::now();
  asio::co_spawn(ctx, fan_out(o, port, r), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
  ctx.run();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::printf("ok %zu, throttled %zu, failed %zu%s%s in %.2f s (%.0f requests/s)\n", r.ok,
              r.throttled, r.failed, r.first_failure.empty() ? "" : ": ", r.first_failure.c_str(),
              secs, static_cast<double>(o.requests) / secs);
  std::printf("client sockets open at once: at most %zu\n", r.sockets.max_open);
  if (server) {
    server_ctx.stop();
    server_thread.join();
    const auto& s = server->stats();
    std::printf("server: %zu requests, max concurrent %zu, throttled %zu, collisions %zu\n",
                s.requests, s.max_concurrent, s.throttled, s.collisions);
  }
  return o.unbounded || (r.ok == o.requests && r.sockets.max_open <= o.limit) ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fanout_client: %s\n", e.what());
  return 1;
}
