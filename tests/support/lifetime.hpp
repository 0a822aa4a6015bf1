// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_LIFETIME_HPP
#define SLUICE_TESTS_SUPPORT_LIFETIME_HPP

// A lifetime-counting helper (as cppcoro's tests have): put one in a coroutine
// frame, and `live()` tells how many such frames still exist.

#include <atomic>

namespace sluice_test {

class lifetime_counter {
 public:
  lifetime_counter() noexcept { count().fetch_add(1); }
  lifetime_counter(const lifetime_counter&) noexcept { count().fetch_add(1); }
  lifetime_counter& operator=(const lifetime_counter&) = default;
  ~lifetime_counter() { count().fetch_sub(1); }

  // Objects alive now.
  static int live() noexcept { return count().load(); }

 private:
  static std::atomic<int>& count() noexcept {
    static std::atomic<int> n{0};
    return n;
  }
};

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_LIFETIME_HPP
