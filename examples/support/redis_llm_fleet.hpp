// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_EXAMPLES_SUPPORT_REDIS_LLM_FLEET_HPP
#define SLUICE_EXAMPLES_SUPPORT_REDIS_LLM_FLEET_HPP

// The LLM shape of examples/fleet.cpp: 4 processes send prompts to one
// provider account whose quota (requests and tokens per window, requests in
// flight) belongs to the account. The provider is a slow_server over TCP
// (slow_server.hpp) that answers THROTTLED past any of the three. First each
// process takes a local sluice::acquire_all of the whole quota (the provider
// sees 4x and throttles); then all of them take the fleet's one budget
// through sluice::redis::acquire_all(rpm, tpm.weighted(tokens), conc).
// It ships beside the examples and includes installed headers only.

#include <sluice/acquire_all.hpp>
#include <sluice/asio.hpp>
#include <sluice/gather.hpp>
#include <sluice/rate_limiter.hpp>
#include <sluice/redis/acquire_all.hpp>
#include <sluice/redis/rate_limiter.hpp>
#include <sluice/redis/semaphore.hpp>
#include <sluice/semaphore.hpp>

#include "redis_run.hpp"
#include "redis_server.hpp"
#include "slow_server.hpp"

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sys/types.h>

namespace sluice_examples {

// The provider's published quota per window, and the prompts.
struct llm_shape {
  std::size_t requests = 40, tokens = 4000, in_flight = 8;  // per window
  int prompts = 20;                                         // per process
  std::chrono::milliseconds window{2000};
  std::chrono::milliseconds latency_min{200}, latency_span{600};
  // The fleet's windows are the provider's + 1/4: a start is recorded at the
  // grant (Redis time) and counted by the provider when the request arrives,
  // a reply and a new TCP connection later; the margin covers that travel.
  std::chrono::milliseconds fleet_window() const { return window + window / 4; }
  static std::size_t tokens_of(int replica, int prompt) {
    return 50 + static_cast<std::size_t>((replica * 7919 + prompt * 104729) % 201);
  }
};

inline llm_shape llm_shape_for(bool fast) {
  llm_shape s;
  if (fast) {
    s.window = std::chrono::milliseconds(1000);
    s.latency_min = std::chrono::milliseconds(50);
    s.latency_span = std::chrono::milliseconds(150);
  }
  return s;
}

// One process: its prompts gathered at once, each behind the account's
// budgets; mode "local" (each process its own sluice::acquire_all) or
// "fleet" (sluice::redis::acquire_all on the shared server).
inline int llm_client(int redis_port, int provider_port, int replica, bool fast,
                      const std::string& mode) {
  const llm_shape q = llm_shape_for(fast);
  asio::io_context ctx;
  run_for(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto conn = co_await connect_to(redis_port);
        sluice::redis::rate_limiter rpm{conn, "{llm-account}:rpm", q.requests, q.fleet_window()};
        sluice::redis::rate_limiter tpm{conn, "{llm-account}:tpm", q.tokens, q.fleet_window()};
        sluice::redis::semaphore conc{conn, "{llm-account}:conc", q.in_flight,
                                      std::chrono::seconds(5)};
        sluice::rate_limiter local_rpm{q.requests, q.fleet_window()};
        sluice::rate_limiter local_tpm{q.tokens, q.fleet_window()};
        sluice::semaphore local_conc{q.in_flight};
        auto prompt = [&](int i) -> asio::awaitable<void> {
          const std::size_t tokens = llm_shape::tokens_of(replica, i);
          const std::string line = "GET p" + std::to_string(replica) + "-" + std::to_string(i) +
                                   " " + std::to_string(tokens);
          if (mode == "fleet") {
            auto held = co_await sluice::redis::acquire_all(rpm, tpm.weighted(tokens), conc);
            co_await request(static_cast<unsigned short>(provider_port), line);
          } else {
            auto held =
                co_await sluice::acquire_all(local_conc, local_rpm, local_tpm.weighted(tokens));
            co_await request(static_cast<unsigned short>(provider_port), line);
          }
        };
        std::vector<asio::awaitable<void>> calls;
        for (int i = 0; i < q.prompts; ++i) calls.push_back(prompt(i));
        co_await sluice::gather(std::move(calls));
        co_await conc.close();
        co_await conn->close();
      }(),
      std::chrono::seconds(120));
  return 0;
}

inline const register_child llm_client_role{"llm_client", [](const std::vector<std::string>& a) {
                                              return llm_client(
                                                  std::stoi(a.at(0)), std::stoi(a.at(1)),
                                                  std::stoi(a.at(2)), a.at(3) == "fast", a.at(4));
                                            }};

struct llm_run {
  server_stats provider;
  double seconds = 0;
  bool ok = true;
};

// 4 client processes in `mode` against a fresh provider in this process.
inline llm_run run_llm_fleet(int redis_port, bool fast, const std::string& mode) {
  const llm_shape q = llm_shape_for(fast);
  asio::io_context pctx;
  server_options o;
  o.latency = [q](std::string_view key, std::size_t) {
    std::size_t h = std::hash<std::string_view>{}(key);
    return q.latency_min + std::chrono::milliseconds(h % (q.latency_span.count() + 1));
  };
  o.throttle_above = q.in_flight;
  o.calls_per_window = q.requests;
  o.tokens_per_window = q.tokens;
  o.window = q.window;
  slow_server provider(pctx, o);
  provider.start();
  std::thread serving([&] { pctx.run(); });
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r)
    pids.push_back(
        spawn_child("llm_client", {std::to_string(redis_port), std::to_string(provider.port()),
                                   std::to_string(r), fast ? "fast" : "slow", mode}));
  llm_run out;
  for (pid_t pid : pids) out.ok = wait_process(pid) == 0 && out.ok;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  pctx.stop();
  serving.join();
  out.provider = provider.stats();
  return out;
}

// The demo: prints both runs; 0 when the fleet's run caused no throttle and
// the local one did (so that the provider's quota is the binding one).
inline int llm_demo(int redis_port, bool fast) {
  const llm_shape q = llm_shape_for(fast);
  std::printf(
      "An LLM provider account shared by 4 processes (%d prompts each, 50-250 tokens); the "
      "provider\n(slow_server over TCP) throttles past %zu requests or %zu tokens per %lld ms, "
      "or %zu in flight.\n",
      q.prompts, q.requests, q.tokens, static_cast<long long>(q.window.count()), q.in_flight);
  {
    // A fresh server grants no permit for one renewal interval + a margin
    // after it starts (the restart grace): wait that out, so that the times
    // below show the quota alone.
    asio::io_context ctx;
    run_for(ctx, [&]() -> asio::awaitable<void> {
      auto conn = co_await connect_to(redis_port);
      sluice::redis::semaphore warm{conn, "{llm-account}:conc", q.in_flight,
                                    std::chrono::seconds(5)};
      co_await warm.acquire();
      warm.release();
      co_await warm.close();
      co_await conn->close();
    }());
  }
  const llm_run local = run_llm_fleet(redis_port, fast, "local");
  std::printf(
      "each process with its own sluice::acquire_all(conc{%zu}, rpm, tpm.weighted(n)):\n"
      "  throttled %zu of %zu, max in flight at the provider %zu, %.2f s\n",
      q.in_flight, local.provider.throttled, local.provider.requests, local.provider.max_concurrent,
      local.seconds);
  const llm_run fleet = run_llm_fleet(redis_port, fast, "fleet");
  std::printf(
      "one sluice::redis::acquire_all(rpm, tpm.weighted(n), conc) for the fleet (windows + 1/4):\n"
      "  throttled %zu of %zu, max in flight at the provider %zu, %.2f s\n",
      fleet.provider.throttled, fleet.provider.requests, fleet.provider.max_concurrent,
      fleet.seconds);
  const std::size_t all = static_cast<std::size_t>(4 * q.prompts);
  const bool ok = local.ok && fleet.ok && local.provider.throttled > 0 &&
                  fleet.provider.throttled == 0 && fleet.provider.ok == all &&
                  fleet.provider.max_concurrent <= q.in_flight;
  if (!ok) std::printf("UNEXPECTED: the fleet's quota did not hold\n");
  return ok ? 0 : 1;
}

}  // namespace sluice_examples

#endif  // SLUICE_EXAMPLES_SUPPORT_REDIS_LLM_FLEET_HPP
