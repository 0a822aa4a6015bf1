// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_PEAK_HPP
#define SLUICE_TESTS_SUPPORT_PEAK_HPP

// The high-water mark that thread- and process-crossing tests keep beside a
// count of holders or calls in flight, to assert a cap independently of the
// limit under test.

#include <atomic>
#include <type_traits>

namespace sluice_test {

// Raises `peak` to `v` if `v` is larger (any thread; `peak` may live in
// memory shared between processes).
template <class T>
void raise_peak(std::atomic<T>& peak, std::type_identity_t<T> v) noexcept {
  T seen = peak.load();
  while (v > seen && !peak.compare_exchange_weak(seen, v)) {
  }
}

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_PEAK_HPP
