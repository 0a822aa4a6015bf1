// SPDX-License-Identifier: BSL-1.0
// clang-format off
// expect: sluice::for_each(s, body): `body(value)` must take the stream's value type and return void, bool, asio::awaitable<void> or asio::awaitable<bool>
#include <sluice/for_each.hpp>
#include <sluice/map_unordered.hpp>

#include <vector>

asio::awaitable<int> fetch(int);

asio::awaitable<void> misuse() {
  // Returns an int: neither void nor bool.
  co_await sluice::for_each(sluice::map_unordered(fetch, std::vector{1, 2, 3}, 2),
                            [](int r) { return r; });
}
