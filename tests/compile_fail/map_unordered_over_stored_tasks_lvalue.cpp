// SPDX-License-Identifier: BSL-1.0
// clang-format off
// expect: sluice::as_completed / map_unordered: the input holds stored asio::awaitable<T>s and is passed as an lvalue
#include <sluice/map_unordered.hpp>

#include <vector>

asio::awaitable<int> task();

asio::awaitable<void> misuse() {
  std::vector<asio::awaitable<int>> tasks;
  tasks.push_back(task());
  auto s = sluice::map_unordered([](asio::awaitable<int> t) { return t; }, tasks, 2);
  co_await s.close();
}
