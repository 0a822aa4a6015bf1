// SPDX-License-Identifier: BSL-1.0
// detail/throw_error.hpp's functions compiled once (see SLUICE_SEPARATE_COMPILATION
// in config.hpp): included by throw_error.hpp, or only by <sluice/src.hpp>.
#ifndef SLUICE_IMPL_THROW_ERROR_IPP
#define SLUICE_IMPL_THROW_ERROR_IPP

#include <stdexcept>
#include <string>

namespace sluice::detail {

void throw_system_error(error_code ec, const char* what) {
  throw system_error(ec, what);
}

void throw_zero_limit(const char* who) {
  throw std::invalid_argument(std::string(who) + ": limit must be at least 1 (got 0)");
}

}  // namespace sluice::detail

#endif  // SLUICE_IMPL_THROW_ERROR_IPP
