// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_THROW_ERROR_HPP
#define SLUICE_DETAIL_THROW_ERROR_HPP

#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>

namespace sluice::detail {

// Throws, out of line. A `throw system_error(ec, "...")` or a message built
// with std::string inside a template is code in every TU that instantiates
// it (system_error's what(), string concatenation: about 1 KB at -O2); here
// it is one call, and with SLUICE_SEPARATE_COMPILATION compiled once per
// program (issue 32).
[[noreturn]] SLUICE_DECL void throw_system_error(error_code ec, const char* what);
// std::invalid_argument "<who>: limit must be at least 1 (got 0)".
[[noreturn]] SLUICE_DECL void throw_zero_limit(const char* who);

// A fan-out's limit: at least 1.
inline void check_limit(std::size_t limit, const char* who) {
  if (limit == 0) throw_zero_limit(who);
}

}  // namespace sluice::detail

#if SLUICE_HEADER_DEFS
#include <sluice/impl/throw_error.ipp>
#endif

#endif  // SLUICE_DETAIL_THROW_ERROR_HPP
