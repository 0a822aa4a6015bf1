// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_NO_LEAK_CHECK_HPP
#define SLUICE_TESTS_SUPPORT_NO_LEAK_CHECK_HPP

// A scope in which LeakSanitizer does not report what is allocated: for the
// tests that destroy an io_context while a sluice call waits, where a known
// leak (see README, "Known limitations") would otherwise hide the
// use-after-free checks those tests exist for.
#if defined(__SANITIZE_ADDRESS__)
#define SLUICE_TEST_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLUICE_TEST_LSAN 1
#endif
#endif
#if defined(SLUICE_TEST_LSAN)
#include <sanitizer/lsan_interface.h>
#endif

namespace sluice_test {

struct no_leak_check {
  no_leak_check() {
#if defined(SLUICE_TEST_LSAN)
    __lsan_disable();
#endif
  }
  ~no_leak_check() {
#if defined(SLUICE_TEST_LSAN)
    __lsan_enable();
#endif
  }
  no_leak_check(const no_leak_check&) = delete;
  no_leak_check& operator=(const no_leak_check&) = delete;
};

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_NO_LEAK_CHECK_HPP
