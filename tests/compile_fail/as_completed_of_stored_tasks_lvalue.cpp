// SPDX-License-Identifier: BSL-1.0
// clang-format off
// expect: sluice::as_completed / map_unordered: the input holds stored asio::awaitable<T>s and is passed as an lvalue, but an awaitable runs only once and would be moved out of it: pass std::move(tasks)
#include <sluice/map_unordered.hpp>

#include <vector>

asio::awaitable<int> task();

asio::awaitable<void> misuse() {
  std::vector<asio::awaitable<int>> tasks;
  tasks.push_back(task());
  auto s = sluice::as_completed(tasks, 2, sluice::return_exceptions);
  co_await s.close();
}
