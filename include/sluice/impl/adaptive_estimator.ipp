// SPDX-License-Identifier: BSL-1.0
// detail::adaptive_estimator's cold side (the parameters' check, a congestion
// event), compiled once (see SLUICE_SEPARATE_COMPILATION in config.hpp):
// included by detail/adaptive_estimator.hpp, or only by <sluice/src.hpp>.
#ifndef SLUICE_IMPL_ADAPTIVE_ESTIMATOR_IPP
#define SLUICE_IMPL_ADAPTIVE_ESTIMATOR_IPP

namespace sluice::detail {

void adaptive_estimator::check(const algorithm& algo, void (*fail)(const std::string&)) {
  std::visit(
      [&](const auto& a) {
        if (!(a.backoff > 0.0 && a.backoff <= 1.0)) fail("backoff must be in (0, 1]");
        using A = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<A, vegas>) {
          if (!(a.alpha >= 0.0 && a.beta >= a.alpha)) fail("vegas needs 0 <= alpha <= beta");
        } else if (!(a.increase >= 0.0)) {
          fail("increase must be >= 0");
        }
        if constexpr (std::is_same_v<A, gradient>) {
          if (!(a.tolerance > 1.0)) fail("gradient tolerance must be > 1");
        }
        if constexpr (!std::is_same_v<A, aimd>) {
          if (a.baseline_window < 1) fail("baseline_window must be >= 1");
        }
      },
      algo);
}

void adaptive_estimator::on_pushback(std::uint64_t epoch, std::size_t limit) {
  if (epoch != epoch_) return;
  ceiling_ = static_cast<double>(limit);
  std::visit([this](const auto& a) { estimate_ *= a.backoff; }, algorithm_);
  hold_left_ = std::visit([](const auto& a) { return a.hold; }, algorithm_);
  round_count_ = 0;
  round_sum_ = 0.0;
  ++epoch_;
  clamp();
}

}  // namespace sluice::detail

#endif  // SLUICE_IMPL_ADAPTIVE_ESTIMATOR_IPP
