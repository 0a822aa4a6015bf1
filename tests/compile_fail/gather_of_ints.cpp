// SPDX-License-Identifier: BSL-1.0
// expect: sluice::gather takes a range of asio::awaitable<T>
#include <sluice/gather.hpp>

#include <vector>

asio::awaitable<void> misuse() {
  co_await sluice::gather(std::vector<int>{1, 2, 3});
}
