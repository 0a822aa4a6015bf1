// SPDX-License-Identifier: BSL-1.0
// detail::child_set's functions compiled once (see SLUICE_SEPARATE_COMPILATION
// in config.hpp): included by detail/child_set.hpp, or only by <sluice/src.hpp>.
#ifndef SLUICE_IMPL_CHILD_SET_IPP
#define SLUICE_IMPL_CHILD_SET_IPP

namespace sluice::detail {

void child_set::cancel_all(std::size_t except, asio::cancellation_type type) {
  stopping_ = true;
  if (type == asio::cancellation_type::none) return;
  for (std::size_t i = 0; i < slots_.size(); ++i)
    if (i != except) cancel(i, type);
}

void child_set::on_done(std::size_t i, std::exception_ptr e) {
  slots_[i].clear();
  if (e && !escaped_) escaped_ = std::move(e);
  if (--running_ == 0 && joiner_) {
    joiner_.complete(parent_cancelled_ ? error_code(asio::error::operation_aborted) : error_code());
  }
}

}  // namespace sluice::detail

#endif  // SLUICE_IMPL_CHILD_SET_IPP
