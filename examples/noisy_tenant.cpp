// SPDX-License-Identifier: BSL-1.0
// Noisy tenant (virtual time, exact; the scenario: support/fair_share_scenario.hpp):
// 10 tenants share a provider; nine quiet ones send 2 calls each every
// 200 ms, 10 times; the noisy one sends 200 calls (10x) in one burst. The
// quiet tenants' waits alone, beside the burst with the provider's limit
// used FIFO, and beside it with fair shares, for four provider limits: 8
// calls at once (semaphore{8} / fair_semaphore{8}), 8 requests per sliding
// 50 ms (rate_limiter / fair_limit<rate_limiter>), 800 tokens per 50 ms with
// calls of 100 tokens and noisy calls of 200 (the same), and an
// adaptive_limit of 8 (adaptive_limit / fair_limit<adaptive_limit>). Then all
// ten backlogged with weights: each one's share of the grants against its
// weight (fair_semaphore), and Jain's fairness index over share/weight for
// every fair limit.
//
//   noisy_tenant            the tables, as markdown (docs/fanout.md: make fanout-docs)
//   noisy_tenant --virtual  the same (the suite runs it); exits 1 if a fair limit misses
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
using namespace std::chrono_literals;

namespace {

double ms(std::chrono::nanoseconds d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

bool ok = true;

// Three rows: alone, the burst FIFO, the burst with fair shares. `fifo()` and
// `fair()` make a new limit for each run (a limit keeps the clock of the loop
// it first waited on).
template <class Fifo, class Fair>
void rows(const char* limit, const char* fifo_name, const char* fair_name, Fifo fifo, Fair fair,
          std::size_t quiet_units = 1, std::size_t noisy_units = 1) {
  const auto alone = scenario::run(false, fair(), quiet_units, noisy_units);
  const double alone_p99 = ms(scenario::percentile(alone.quiet, 99));
  auto row = [&](std::string name, const scenario::waits& w) {
    const double p99 = ms(scenario::percentile(w.quiet, 99));
    std::printf("| %s | %.0f ms | %.0f ms | %.1fx | ", name.c_str(),
                ms(scenario::percentile(w.quiet, 50)), p99, p99 / alone_p99);
    if (w.noisy_done.count() != 0) {
      std::printf("%.2f s |\n", ms(w.noisy_done) / 1000);
    } else {
      std::printf("- |\n");
    }
    return p99;
  };
  row(std::string(limit) + ": alone (no noisy tenant)", alone);
  row(std::string("+ noisy burst, FIFO ") + fifo_name,
      scenario::run(true, fifo(), quiet_units, noisy_units));
  if (row(std::string("+ noisy burst, ") + fair_name,
          scenario::run(true, fair(), quiet_units, noisy_units)) > 2 * alone_p99)
    ok = false;
}

// Jain's index and the largest deviation from the weight share.
void shares(const char* name, const std::vector<double>& got) {
  const std::vector<double> weight = scenario::weights();
  double sum = 0, worst = 0;
  for (double g : got) sum += g;
  for (std::size_t t = 0; t < got.size(); ++t) {
    const double want = weight[t] / 10.5;
    worst = std::max(worst, std::abs(got[t] / sum - want) / want);
  }
  const double jain = scenario::jain(got);
  std::printf("| %s | %.0f | %.4f | %.1f%% |\n", name, sum, jain, 100 * worst);
  if (jain < 0.99 || worst > 0.05) ok = false;
}

}  // namespace

int main() {
  std::printf(
      "| provider limit, 9 quiet tenants (180 calls) | quiet p50 wait | quiet p99 wait | "
      "p99 vs alone | noisy burst done |\n|---|---|---|---|---|\n");
  rows("8 at once", "`semaphore{8}`", "`fair_semaphore{8}`", scenario::fifo, scenario::fair);
  rows(
      "8 requests per 50 ms", "`rate_limiter{8, 50ms}`", "`fair_limit<rate_limiter>`",
      [] { return scenario::fifo_rate(8, 50ms); }, [] { return scenario::fair_rate(8, 50ms); });
  rows(
      "800 tokens per 50 ms (calls of 100, noisy 200)", "`rate_limiter{800, 50ms}`",
      "`fair_limit<rate_limiter>`", [] { return scenario::fifo_rate(800, 50ms); },
      [] { return scenario::fair_rate(800, 50ms); }, 100, 200);
  rows("`adaptive_limit` of 8", "`adaptive_limit`", "`fair_limit<adaptive_limit>`",
       scenario::fifo_adaptive, scenario::fair_adaptive);

  const std::vector<double> grants = scenario::backlogged_grants();
  const std::vector<double> weight = scenario::weights();
  std::printf(
      "\n| tenant | weight | grants (of 462, all backlogged) | share | weight / sum of weights "
      "|\n|---|---|---|---|---|\n");
  for (std::size_t t = 0; t < grants.size(); ++t) {
    const double share = grants[t] / 462, want = weight[t] / 10.5;
    if (t == 0 || t >= 8)
      std::printf("| %zu%s | %.1f | %.0f | %.3f | %.3f |\n", t, t == 0 ? " (1-7 the same)" : "",
                  weight[t], grants[t], share, want);
  }
  std::printf(
      "\n| all ten backlogged, weights 8 x 1, 2, 0.5 | units granted | Jain's index over "
      "share/weight | largest deviation from the weight share |\n|---|---|---|---|\n");
  shares("`fair_semaphore{8}`, calls held 10 ms", grants);
  shares(
      "`fair_limit<rate_limiter>`, 8 requests per 10 ms",
      scenario::backlogged_units(
          scenario::weighted_fair<sluice::rate_limiter>(std::size_t{8}, 10ms), scenario::one_unit));
  shares("`fair_limit<rate_limiter>`, 800 tokens per 10 ms, calls of 50-150",
         scenario::backlogged_units(
             scenario::weighted_fair<sluice::rate_limiter>(std::size_t{800}, 10ms),
             scenario::call_tokens));
  shares("`fair_limit<adaptive_limit>` of 8, calls held 10 ms",
         scenario::backlogged_units(
             scenario::weighted_fair<sluice::adaptive_limit>(scenario::adaptive_options()),
             scenario::one_unit));
  return ok ? 0 : 1;
}
