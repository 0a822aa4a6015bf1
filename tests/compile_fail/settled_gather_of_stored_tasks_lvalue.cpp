// SPDX-License-Identifier: BSL-1.0
// clang-format off
// expect: sluice::gather / gather_with_concurrency: `tasks` holds stored asio::awaitable<T>s and is passed as an lvalue
#include <sluice/gather.hpp>

#include <span>
#include <vector>

asio::awaitable<int> task();

asio::awaitable<void> misuse() {
  std::vector<asio::awaitable<int>> tasks;
  tasks.push_back(task());
  // A span lends the vector's awaitables out just as the lvalue does.
  co_await sluice::gather(std::span(tasks), sluice::return_exceptions);
}
