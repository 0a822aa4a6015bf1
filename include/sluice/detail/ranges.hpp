// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_RANGES_HPP
#define SLUICE_DETAIL_RANGES_HPP

// The range vocabulary sluice names (std::ranges::begin, end, size,
// iter_move, iterator_t, sentinel_t, range_value_t, range_reference_t,
// range_rvalue_reference_t, input_range, sized_range, borrowed_range), without
// the views of <ranges>, which sluice never uses and which cost every TU that
// includes a fan-out header about 0.2 s of clang++ 14 (0.15 s of g++ 12) on
// top of <asio.hpp> (issue 32, docs/performance.md "Compile cost").
// libstdc++ declares all of them in <bits/ranges_base.h>, the part of <ranges>
// that <string_view> and <span> include too; any other standard library gets
// <ranges>. A program that uses views includes <ranges> itself, as it must.
#if defined(__GLIBCXX__) && defined(__has_include)
#if __has_include(<bits/ranges_base.h>)
#include <bits/ranges_base.h>
#define SLUICE_DETAIL_RANGES_BASE 1
#endif
#endif
#if !defined(SLUICE_DETAIL_RANGES_BASE)
#include <ranges>
#endif

#endif  // SLUICE_DETAIL_RANGES_HPP
