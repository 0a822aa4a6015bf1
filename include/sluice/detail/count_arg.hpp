// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_COUNT_ARG_HPP
#define SLUICE_DETAIL_COUNT_ARG_HPP

// Counts (permits, calls per window, a burst) taken as any integer type, so
// that `sluice::semaphore sem{n}` with an `int n` is not a narrowing error
// (clang rejects it, g++ accepts it): checked, then converted to std::size_t.

#include <concepts>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace sluice::detail {

// An integer that names a count: any integral type but bool.
template <class I>
concept count_integer = std::integral<I> && !std::same_as<std::remove_cv_t<I>, bool>;

// `v` as a std::size_t; std::invalid_argument naming `what` if it is
// negative.
template <count_integer I>
std::size_t to_count(I v, const char* what) {
  if constexpr (std::is_signed_v<I>) {
    if (v < 0) throw std::invalid_argument(std::string(what) + " must not be negative");
  }
  return static_cast<std::size_t>(v);
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_COUNT_ARG_HPP
