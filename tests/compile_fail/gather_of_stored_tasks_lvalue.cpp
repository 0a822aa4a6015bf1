// SPDX-License-Identifier: BSL-1.0
// clang-format off
// expect: sluice::gather / gather_with_concurrency: `tasks` holds stored asio::awaitable<T>s and is passed as an lvalue, but an awaitable runs only once and would be moved out of it: pass std::move(tasks)
#include <sluice/gather.hpp>

#include <vector>

asio::awaitable<int> task();

asio::awaitable<void> misuse() {
  std::vector<asio::awaitable<int>> tasks;
  tasks.push_back(task());
  co_await sluice::gather(tasks);  // gathering `tasks` again would run moved-from awaitables
}
