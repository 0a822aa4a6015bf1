// SPDX-License-Identifier: BSL-1.0
// detail::hedge_core's cold side (construction, stats, the quantile), compiled
// once (see SLUICE_SEPARATE_COMPILATION in config.hpp): included by hedge.hpp,
// or only by <sluice/src.hpp>.
#ifndef SLUICE_IMPL_HEDGE_IPP
#define SLUICE_IMPL_HEDGE_IPP

#include <algorithm>
#include <stdexcept>

namespace sluice::detail {

hedge_core::hedge_core(hedge_options o) : opt_(o) {
  if (!(opt_.budget >= 0.0) || !(opt_.quantile >= 0.0 && opt_.quantile < 1.0))
    throw std::invalid_argument("sluice::hedge: budget must be >= 0 and quantile in [0, 1)");
  if (opt_.window == 0) throw std::invalid_argument("sluice::hedge: window must be >= 1");
}

hedge_stats hedge_core::stats() {
  std::lock_guard lock(mutex_);
  hedge_stats s = stats_;
  s.delay = delay_locked();
  return s;
}

clock::duration hedge_core::delay_locked() {
  if (opt_.quantile <= 0.0 || samples_.size() < opt_.min_samples || samples_.empty())
    return opt_.after;
  sorted_ = samples_;
  const auto k = static_cast<std::size_t>(opt_.quantile * static_cast<double>(sorted_.size()));
  std::nth_element(sorted_.begin(), sorted_.begin() + static_cast<std::ptrdiff_t>(k),
                   sorted_.end());
  return sorted_[k];
}

}  // namespace sluice::detail

#endif  // SLUICE_IMPL_HEDGE_IPP
