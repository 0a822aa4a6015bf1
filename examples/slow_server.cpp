// SPDX-License-Identifier: BSL-1.0
// A real slow provider on loopback: a line-protocol TCP server
// (examples/support/slow_server.hpp). `GET <key>` answers `OK <key> <ms>` after a
// latency of 5 to 30 ms, or `THROTTLED <key>` beyond its limits; every request
// for a key that is already in flight is logged as a collision, as pynenc's
// demo does. Point examples/fanout_client at it.
//
//   slow_server [--port 7777] [--throttle-above N] [--throttle-per-key N]
//               [--quota N --window-ms W] [--slower K]
//               serves until Ctrl-C, then prints its statistics; --quota: at
//               most N requests arriving in any W ms (a published rate quota);
//               --slower: every latency K times as long
//   slow_server --virtual
//               a short self-contained run: a free port, 40 requests over 3
//               keys from an in-process client, the collision log, the stats

#include <sluice/asio.hpp>
#include <sluice/gather.hpp>

#include "support/slow_server.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

namespace {

// 5..30 ms, a function of the key and the request's index.
std::chrono::milliseconds latency(std::string_view key, std::size_t index) {
  std::size_t h = std::hash<std::string_view>{}(key) ^ (index * 0x9e3779b97f4a7c15ULL);
  h ^= h >> 29;
  return std::chrono::milliseconds(5 + static_cast<long>(h % 26));
}

void print_stats(const sluice_examples::slow_server& srv) {
  const auto& s = srv.stats();
  std::printf("requests %zu, ok %zu, throttled %zu, max concurrent %zu, collisions %zu\n",
              s.requests, s.ok, s.throttled, s.max_concurrent, s.collisions);
  for (const auto& [key, n] : s.max_per_key)
    if (n > 1) std::printf("  key %s: up to %zu at once\n", key.c_str(), n);
}

int self_contained() {
  asio::io_context ctx;
  sluice_examples::server_options o;
  o.latency = latency;
  o.log = &std::cout;
  sluice_examples::slow_server srv(ctx, o);
  srv.start();
  std::printf("[virtual] serving on 127.0.0.1:%u; 40 requests over 3 keys, 8 at a time\n",
              static_cast<unsigned>(srv.port()));
  std::exception_ptr failure;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        std::vector<asio::awaitable<std::string>> calls;
        for (int i = 0; i < 40; ++i)
          calls.push_back(sluice_examples::request(srv.port(), "GET key" + std::to_string(i % 3)));
        auto replies = co_await sluice::gather_with_concurrency(8, std::move(calls));
        std::printf("first reply: %s\n", replies.front().c_str());
      },
      [&](std::exception_ptr e) {
        failure = e;
        ctx.stop();
      });
  ctx.run();
  if (failure) std::rethrow_exception(failure);
  print_stats(srv);
  return srv.stats().ok == 40 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  unsigned short port = 7777;
  sluice_examples::server_options o;
  o.latency = latency;
  o.log = &std::cout;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--virtual") return self_contained();
    if (i + 1 >= argc) break;
    if (a == "--port") port = static_cast<unsigned short>(std::atoi(argv[++i]));
    if (a == "--throttle-above") o.throttle_above = std::strtoul(argv[++i], nullptr, 10);
    if (a == "--throttle-per-key") o.throttle_per_key = std::strtoul(argv[++i], nullptr, 10);
    if (a == "--quota") o.calls_per_window = std::strtoul(argv[++i], nullptr, 10);
    if (a == "--window-ms") o.window = std::chrono::milliseconds(std::atol(argv[++i]));
    if (a == "--slower") {
      o.latency = [k = std::atol(argv[++i])](std::string_view key, std::size_t index) {
        return latency(key, index) * k;
      };
    }
  }
  asio::io_context ctx;
  sluice_examples::slow_server srv(ctx, o, port);
  srv.start();
  asio::signal_set stop(ctx, SIGINT, SIGTERM);
  stop.async_wait([&](sluice::error_code, int) { ctx.stop(); });
  std::printf("serving on 127.0.0.1:%u (Ctrl-C stops)\n", static_cast<unsigned>(srv.port()));
  std::fflush(stdout);  // a script that started it waits for this line
  ctx.run();
  print_stats(srv);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "slow_server: %s\n", e.what());
  return 1;
}
