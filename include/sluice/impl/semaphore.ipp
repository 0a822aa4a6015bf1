// SPDX-License-Identifier: BSL-1.0
// sluice::semaphore's functions compiled once (see SLUICE_SEPARATE_COMPILATION
// in config.hpp): included by semaphore.hpp, or only by <sluice/src.hpp>.
#ifndef SLUICE_IMPL_SEMAPHORE_IPP
#define SLUICE_IMPL_SEMAPHORE_IPP

namespace sluice {

semaphore::semaphore(const char* name, std::size_t initial, bool bounded, asio::any_io_executor ex)
    : core_(name, initial, bounded, std::move(ex)) {}

semaphore::semaphore(const char* name, std::size_t initial, bool bounded, asio::any_io_executor ex,
                     const shed_options& shed)
    : core_(name, initial, bounded, std::move(ex), shed) {}

semaphore::~semaphore() = default;

bool semaphore::try_acquire() {
  return core_.try_acquire();
}

void semaphore::release() {
  core_.release(
      "sluice::bounded_semaphore::release: released more often than acquired (the value "
      "would exceed its initial value)");
}

sluice::stats semaphore::stats() const noexcept {
  return core_.stats();
}

void semaphore::release_held(detail::clock::time_point since) {
  core_.record_hold(since);
  release();
}

}  // namespace sluice

#endif  // SLUICE_IMPL_SEMAPHORE_IPP
