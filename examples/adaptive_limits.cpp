// SPDX-License-Identifier: BSL-1.0
// A provider whose capacity changes under a batch of 3000 calls: 8 in flight
// for 5 minutes, then 3 for 5 minutes, then 12; a call over the capacity is
// throttled at once (429) and its job waits 1 s before it queues again; the
// latency is 1 s idle and grows with load (2.5 s at capacity). Run in virtual
// time (exact, instantaneous) through fixed limits 3, 8 and 12, through
// adaptive_limit (AIMD, gradient, Vegas), and through an oracle that knows the
// capacity at every instant.
//
//   adaptive_limits                     prints the table (markdown)
//   adaptive_limits --csv limits.csv    also writes the limit over time, per second
//
// The plot in docs/: python3 examples/adaptive_limits_plot.py limits.csv docs/adaptive_limit
// (or `make adaptive-docs`).

#include "support/capacity_scenario.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace cap = sluice_examples::capacity;

int main(int argc, char** argv) {
  const char* csv = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) csv = argv[++i];
  }
  std::vector<cap::result> rows;
  rows.push_back(cap::run_oracle());
  for (std::size_t limit : {3, 8, 12}) rows.push_back(cap::run_fixed(limit));
  rows.push_back(cap::run_adaptive("adaptive: aimd", sluice::aimd{}));
  rows.push_back(
      cap::run_adaptive("adaptive: aimd hold 0 (plain sawtooth)", sluice::aimd{.hold = 0}));
  rows.push_back(cap::run_adaptive("adaptive: gradient", sluice::gradient{}));
  rows.push_back(cap::run_adaptive("adaptive: vegas", sluice::vegas{}));

  const double oracle = std::chrono::duration<double>(rows[0].makespan).count();
  std::printf("| limit | makespan | vs oracle | calls | throttled | throttled %% |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  for (const auto& r : rows) {
    const double m = std::chrono::duration<double>(r.makespan).count();
    std::printf("| %s | %.0f s | %+.1f%% | %zu | %zu | %.2f%% |\n", r.name.c_str(), m,
                100.0 * (m / oracle - 1.0), r.calls, r.throttles,
                100.0 * static_cast<double>(r.throttles) / static_cast<double>(r.calls));
  }
  if (csv != nullptr) {
    std::FILE* f = std::fopen(csv, "w");
    if (f == nullptr) {
      std::perror(csv);
      return 1;
    }
    // One row per second: the capacity, then each adaptive run's limit (empty
    // once that run has finished).
    std::vector<const cap::result*> traced;
    std::fprintf(f, "t,capacity");
    for (const auto& r : rows) {
      if (r.limit_trace.empty() || r.name.rfind("adaptive", 0) != 0) continue;
      traced.push_back(&r);
      std::fprintf(f, ",%s", r.name.c_str());
    }
    std::fprintf(f, "\n");
    sluice::testing::slow_service svc(cap::service_options());
    std::size_t n = 0;
    for (const auto* r : traced) n = std::max(n, r->limit_trace.size());
    for (std::size_t i = 0; i < n; ++i) {
      std::fprintf(f, "%zu,%zu", i, svc.capacity_at(std::chrono::seconds(i)));
      for (const auto* r : traced) {
        if (i < r->limit_trace.size()) {
          std::fprintf(f, ",%zu", r->limit_trace[i].second);
        } else {
          std::fprintf(f, ",");
        }
      }
      std::fprintf(f, "\n");
    }
    std::fclose(f);
  }
  return 0;
}
