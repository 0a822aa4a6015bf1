// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_FAIR_SHARE_HPP
#define SLUICE_FAIR_SHARE_HPP

#include <sluice/config.hpp>

#include <cstddef>

namespace sluice {

/// Options of the fair limits (`sluice::fair_semaphore`, `sluice::fair_limit`).
struct fair_options {
  /// How many of the latest grants `stats(key).share` is measured over.
  std::size_t window = 1000;
};

/// What one key of a fair limit (`fair_semaphore`, `fair_limit`) is doing now.
struct fair_share {
  std::size_t waiting = 0;  ///< calls of this key not granted yet
  std::size_t in_use = 0;   ///< permits this key holds (0 for rate limits: a start is not held)
  double weight = 1.0;      ///< its weight
  double share = 0.0;       ///< its part of the units of the last `window` grants (0 to 1)
};

}  // namespace sluice

#endif  // SLUICE_FAIR_SHARE_HPP
