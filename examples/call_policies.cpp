// SPDX-License-Identifier: BSL-1.0
// Call policies in virtual time: the tail-latency table (a fan-out of 10
// calls per request, 1% of calls 100x slower, with and without a hedge at the
// p95) and the overload table (arrivals at twice the provider's capacity for
// a minute, with and without shedding), as docs/provider-limits.md shows them.
// tests/policy_test.cpp asserts the same figures.
//
//   call_policies [--table hedge|overload] [--csv FILE]
//       prints both tables, or the one named (what `make policy-docs` splices
//       into docs/provider-limits.md); --csv: every request's latency without
//       and with the hedge, which examples/call_policies_plot.py draws
#include "support/policy_scenarios.hpp"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

namespace sc = sluice_examples::policies;

static double ms(sc::ns d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

static void hedge_table(const sc::tail_result& plain, const sc::tail_result& hedged) {
  std::printf("| | request p50 | p95 | p99 | max | provider calls | extra calls |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  for (const auto* r : {&plain, &hedged}) {
    std::printf("| %s | %.3f ms | %.3f ms | %.3f ms | %.3f ms | %zu | %.2f%% |\n",
                r == &hedged ? "hedge at the p95, budget 5%" : "no hedge", ms(r->p50), ms(r->p95),
                ms(r->p99), ms(r->max), r->provider, 100.0 * r->extra());
  }
  std::printf("\nThe p99 is %.1fx shorter for %.2f%% more calls.\n", ms(plain.p99) / ms(hedged.p99),
              100.0 * hedged.extra());
}

static void overload_table() {
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

int main(int argc, char** argv) {
  std::string table, csv;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (argv[i] == std::string("--table")) table = argv[i + 1];
    if (argv[i] == std::string("--csv")) csv = argv[i + 1];
  }
  if (table != "overload") {
    const auto plain = sc::run_tail(false), hedged = sc::run_tail(true);
    if (table.empty())
      std::printf("Tail latency: %zu requests of %zu calls each; 1%% of calls 100x slower\n\n",
                  sc::tail_requests, sc::fan_out);
    hedge_table(plain, hedged);
    if (!csv.empty()) {
      std::ofstream out(csv);
      out << "request,no_hedge_ms,hedged_ms\n";
      for (std::size_t i = 0; i < plain.latency.size(); ++i)
        out << i << ',' << ms(plain.latency[i]) << ',' << ms(hedged.latency[i]) << '\n';
    }
  }
  if (table.empty())
    std::printf(
        "\nOverload: one arrival every %.1f ms for %.0f s against %zu in flight x 100 ms "
        "(twice the capacity)\n\n",
        ms(sc::arrival_gap), ms(sc::overload_for) / 1000, sc::capacity);
  if (table != "hedge") overload_table();
  return 0;
}
