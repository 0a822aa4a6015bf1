// SPDX-License-Identifier: BSL-1.0
// Call policies in virtual time: the tail-latency table (a fan-out of 10
// calls per request, 1% of calls 100x slower, with and without a hedge at the
// p95) and the overload table (arrivals at twice the provider's capacity for
// a minute, with and without shedding), as printed in docs/provider-limits.md.
// tests/policy_test.cpp asserts the same figures.
#include "support/policy_scenarios.hpp"

#include <chrono>
#include <cstdio>

namespace sc = sluice_examples::policies;

static double ms(sc::ns d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

int main() {
  std::printf("Tail latency: %zu requests of %zu calls each; 1%% of calls 100x slower\n\n",
              sc::tail_requests, sc::fan_out);
  std::printf("| | request p50 | p95 | p99 | max | provider calls | extra calls |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  for (bool hedged : {false, true}) {
    const auto r = sc::run_tail(hedged);
    std::printf("| %s | %.3f ms | %.3f ms | %.3f ms | %.3f ms | %zu | %.2f%% |\n",
                hedged ? "hedge at the p95, budget 5%" : "no hedge", ms(r.p50), ms(r.p95),
                ms(r.p99), ms(r.max), r.provider, 100.0 * r.extra());
  }
  std::printf(
      "\nOverload: one arrival every %.1f ms for %.0f s against %zu in flight x 100 ms "
      "(twice the capacity)\n\n",
      ms(sc::arrival_gap), ms(sc::overload_for) / 1000, sc::capacity);
  std::printf(
      "| | arrived | accepted | shed | accepted calls' wait p50 | p99 | max | last call "
      "ends |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (bool shedding : {false, true}) {
    const auto r = sc::run_overload(shedding);
    std::printf("| %s | %zu | %zu | %zu | %.1f ms | %.1f ms | %.1f ms | %.1f s |\n",
                shedding ? "shed past 8 waiting" : "queue without bound", r.arrived, r.accepted,
                r.shed, ms(r.p50_wait), ms(r.p99_wait), ms(r.max_wait), ms(r.last_done) / 1000);
  }
}
