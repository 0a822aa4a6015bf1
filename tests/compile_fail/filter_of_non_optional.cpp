// SPDX-License-Identifier: BSL-1.0
// expect: sluice::filter: `fn(input)` must return asio::awaitable<std::optional<T>>
#include <sluice/filter.hpp>

#include <vector>

asio::awaitable<int> twice(int i) {
  co_return 2 * i;
}

void misuse() {
  std::vector<int> in{1, 2, 3};
  auto s = sluice::filter(twice, in, 2);
}
