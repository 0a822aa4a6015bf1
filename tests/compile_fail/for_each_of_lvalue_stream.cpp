// SPDX-License-Identifier: BSL-1.0
// expect: sluice::for_each takes the stream by value, because it closes it: pass std::move(s)
#include <sluice/for_each.hpp>
#include <sluice/map_unordered.hpp>

#include <vector>

asio::awaitable<int> fetch(int);

asio::awaitable<void> misuse() {
  auto s = sluice::map_unordered(fetch, std::vector{1, 2, 3}, 2);
  co_await sluice::for_each(s, [](int) {});
}
