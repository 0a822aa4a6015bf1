// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_DOUBLES_HPP
#define SLUICE_DETAIL_DOUBLES_HPP

// The few operations on doubles the limits need, without <cmath>: its
// special functions cost every includer about 0.3 s of parsing (issue 32).
// Same results as std::isfinite / floor / ceil / round on IEEE 754 doubles
// (but for the sign of a zero).

#include <sluice/config.hpp>

#include <cstdint>

namespace sluice::detail {

// Neither infinite nor NaN.
constexpr bool is_finite(double x) noexcept {
  return x - x == 0.0;
}

constexpr double floor(double x) noexcept {
  if (!(x > -0x1p52 && x < 0x1p52)) return x;  // integral already, or not finite
  const double t = static_cast<double>(static_cast<std::int64_t>(x));  // toward zero
  return t > x ? t - 1.0 : t;
}

constexpr double ceil(double x) noexcept {
  return -floor(-x);
}

// Half-way cases away from zero.
constexpr double round(double x) noexcept {
  if (x < 0.0) return -round(-x);
  const double t = floor(x);
  return x - t >= 0.5 ? t + 1.0 : t;  // x - t is exact below 2^52
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_DOUBLES_HPP
