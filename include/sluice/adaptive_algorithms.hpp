// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_ADAPTIVE_ALGORITHMS_HPP
#define SLUICE_ADAPTIVE_ALGORITHMS_HPP

// How an adaptive_limit moves its limit: the algorithms' settings (a
// vocabulary header; their logic is detail/adaptive_estimator.hpp).

#include <cstddef>

namespace sluice {

/// Additive increase, multiplicative decrease (TCP's congestion control, as in
/// Netflix's concurrency-limits `AIMDLimit`): while the limit is in use, each
/// round of `limit` successful calls adds `increase`; a throttle or a drop
/// multiplies the limit by `backoff`. After a throttle the limit stays below
/// the level that was throttled for `hold` successful calls before it probes
/// that level again, so a provider whose capacity stays put sees about one
/// throttle per `hold` calls (the plain sawtooth costs one per ~limit² / 2).
struct aimd {
  double increase = 1.0;   ///< added per round of `limit` successes (>= 0)
  double backoff = 0.9;    ///< the limit's factor on a throttle or a drop, in (0, 1]
  std::size_t hold = 200;  ///< successes below a throttled level before probing it again
};

/// Latency-based (after Netflix's Gradient / Gradient2): the limit falls as
/// soon as the mean latency of a round rises above `tolerance` times the
/// no-load baseline (the lowest latency seen in the last one or two
/// `baseline_window` samples), by the gradient `tolerance · baseline /
/// latency` (at most halving it), and otherwise grows by `increase` per
/// round; throttles and drops act as in `aimd`. It trades a little
/// throughput for latency: the limit settles where the provider's latency is
/// `tolerance` times its idle latency, usually before any 429. Under steady
/// load at capacity for longer than the window, the baseline converges to the
/// loaded latency and the limit then probes by throttles, as `aimd` does.
struct gradient {
  double tolerance = 2.0;  ///< latency / baseline above which the limit falls (> 1)
  double increase = 1.0;   ///< added per round while the latency is within tolerance
  double backoff = 0.9;    ///< the limit's factor on a throttle or a drop, in (0, 1]
  std::size_t hold = 200;  ///< successes below a throttled level before probing it again
  std::size_t baseline_window = 10000;  ///< samples the baseline remembers (1 to 2 windows)
};

/// Queue-based (after TCP Vegas and Netflix's `VegasLimit`): once per round
/// the calls queued at the provider are estimated as `limit · (1 − baseline /
/// latency)`; the limit grows by one while that is below `alpha`, falls by one
/// above `beta`; throttles and drops act as in `aimd`.
struct vegas {
  double alpha = 3.0;      ///< queued calls under which the limit grows
  double beta = 6.0;       ///< queued calls above which the limit falls (>= alpha)
  double backoff = 0.9;    ///< the limit's factor on a throttle or a drop, in (0, 1]
  std::size_t hold = 200;  ///< successes below a throttled level before probing it again
  std::size_t baseline_window = 10000;  ///< samples the baseline remembers (1 to 2 windows)
};

}  // namespace sluice

#endif  // SLUICE_ADAPTIVE_ALGORITHMS_HPP
