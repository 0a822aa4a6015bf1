// SPDX-License-Identifier: BSL-1.0
// expect: sluice::gather_with_concurrency takes a limit and a range of asio::awaitable<T>
#include <sluice/gather.hpp>

#include <vector>

asio::awaitable<void> misuse() {
  co_await sluice::gather_with_concurrency(4, std::vector<int>{1, 2});
}
