// SPDX-License-Identifier: BSL-1.0
// Noisy tenant (virtual time, exact; the scenario: support/fair_share_scenario.hpp):
// 10 tenants share a provider cap of 8; nine quiet ones send 2 calls each
// every 200 ms, 10 times; the noisy one sends 200 calls (10x) in one burst.
// The quiet tenants' waits alone, beside the burst with one FIFO
// sluice::semaphore{8}, and beside it with sluice::fair_semaphore{8}. Then
// all ten backlogged with weights: each one's share of the grants against its
// weight, and Jain's fairness index over share/weight.
//
//   noisy_tenant            the tables, as markdown (docs/fanout.md: make fanout-docs)
//   noisy_tenant --virtual  the same (the suite runs it); exits 1 if fair shares miss
//                           "quiet p99 within 2x of alone" or "Jain's index >= 0.99"

#include "support/fair_share_scenario.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace scenario = sluice_examples::fair_share;

namespace {

double ms(std::chrono::nanoseconds d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace

int main() {
  const auto alone = scenario::run(false, scenario::fair());
  const auto with_fifo = scenario::run(true, scenario::fifo());
  const auto with_fair = scenario::run(true, scenario::fair());
  const double alone_p99 = ms(scenario::percentile(alone.quiet, 99));
  std::printf(
      "| 9 quiet tenants (180 calls) | quiet p50 wait | quiet p99 wait | p99 vs alone | "
      "noisy burst done |\n|---|---|---|---|---|\n");
  auto row = [&](const char* name, const scenario::waits& w) {
    const double p99 = ms(scenario::percentile(w.quiet, 99));
    std::printf("| %s | %.0f ms | %.0f ms | %.1fx | ", name, ms(scenario::percentile(w.quiet, 50)),
                p99, p99 / alone_p99);
    if (w.noisy_done.count() != 0) {
      std::printf("%.2f s |\n", ms(w.noisy_done) / 1000);
    } else {
      std::printf("- |\n");
    }
  };
  row("alone (no noisy tenant)", alone);
  row("+ noisy burst, FIFO `semaphore{8}`", with_fifo);
  row("+ noisy burst, `fair_semaphore{8}`", with_fair);

  const std::vector<double> grants = scenario::backlogged_grants();
  const std::vector<double> weight = scenario::weights();
  double worst = 0;
  std::printf(
      "\n| tenant | weight | grants (of 462, all backlogged) | share | weight / sum of weights "
      "|\n|---|---|---|---|---|\n");
  for (std::size_t t = 0; t < grants.size(); ++t) {
    const double share = grants[t] / 462, want = weight[t] / 10.5;
    worst = std::max(worst, std::abs(share - want) / want);
    if (t == 0 || t >= 8)
      std::printf("| %zu%s | %.1f | %.0f | %.3f | %.3f |\n", t, t == 0 ? " (1-7 the same)" : "",
                  weight[t], grants[t], share, want);
  }
  const double jain = scenario::jain(grants);
  std::printf(
      "\nJain's index over share/weight: %.4f; largest deviation from the weight share: "
      "%.1f%%\n",
      jain, 100 * worst);
  const bool ok = ms(scenario::percentile(with_fair.quiet, 99)) <= 2 * alone_p99 && jain >= 0.99 &&
                  worst <= 0.05;
  return ok ? 0 : 1;
}
