// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_ABORTED_HPP
#define SLUICE_DETAIL_ABORTED_HPP

#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>

#include <exception>
#include <system_error>

namespace sluice::detail {

// True if `e` holds a system_error of operation_aborted (what a cancellation
// ends with); false for null.
inline bool is_operation_aborted(const std::exception_ptr& e) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const system_error& x) {
    return x.code() == asio::error::operation_aborted;
  } catch (...) {
    return false;
  }
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_ABORTED_HPP
