// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_ENDING_HPP
#define SLUICE_TESTS_SUPPORT_ENDING_HPP

// How a task ended, as a string a test can compare: "ok", "aborted"
// (operation_aborted), or the what() of any other exception.

#include <support/asio.hpp>

#include <exception>
#include <string>
#include <system_error>
#include <utility>

namespace sluice_test {

inline std::string ending_of_exception(std::exception_ptr e) {
  if (!e) return "ok";
  try {
    std::rethrow_exception(e);
  } catch (const sluice::system_error& x) {
    return x.code() == asio::error::operation_aborted ? "aborted" : x.what();
  } catch (const std::exception& x) {
    return x.what();
  }
}

// Awaits `a` and reports how it ended.
template <class A>
asio::awaitable<std::string> ending_of(A a) {
  std::exception_ptr e;
  try {
    co_await std::move(a);
  } catch (...) {
    e = std::current_exception();
  }
  co_return ending_of_exception(e);
}

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_ENDING_HPP
