// SPDX-License-Identifier: BSL-1.0
#include <sluice/filter.hpp>
#include <sluice/for_each.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/outcome.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::virtual_loop;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace {

std::vector<int> iota_vec(int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(i);
  return v;
}

// Keeps the even inputs after `ms` of work.
struct keep_even {
  int ms = 100;
  asio::awaitable<std::optional<int>> operator()(int i) const {
    co_await sluice::sleep(milliseconds(ms));
    if (i % 2 != 0) co_return std::nullopt;
    co_return i;
  }
};

// A downstream stage that counts its calls and how many run at once.
struct store_stage {
  std::size_t calls = 0, running = 0, most = 0;
};

asio::awaitable<int> store(store_stage& s, int v) {
  ++s.calls;
  s.most = std::max(s.most, ++s.running);
  co_await sluice::sleep(1s);
  --s.running;
  co_return v;
}

}  // namespace

TEST_CASE("filter yields only the engaged results, in completion order", "[filter]") {
  virtual_loop loop;
  std::vector<int> got;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(sluice::filter(keep_even{}, iota_vec(10), 3),
                              [&](int v) { got.push_back(v); });
  });
  CHECK(got == std::vector<int>{0, 2, 4, 6, 8});
  CHECK(loop.now() == 400ms);  // 10 inputs of 100 ms, 3 at a time
}

TEST_CASE("a dropped input gives its slot back at once, without waiting for the consumer",
          "[filter]") {
  virtual_loop loop;
  std::vector<nanoseconds> at;
  // Limit 2 over three dropped inputs and a kept one: 0 and 1 are dropped at
  // 100 ms, 2 and 3 start then; 3 is yielded at 200 ms.
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::filter(
        [](int i) -> asio::awaitable<std::optional<int>> {
          co_await sluice::sleep(100ms);
          if (i < 3) co_return std::nullopt;
          co_return i;
        },
        iota_vec(4), 2);
    co_await sluice::for_each(std::move(s), [&](int) { at.push_back(loop.now()); });
  });
  CHECK(at == std::vector<nanoseconds>{200ms});
}

TEST_CASE("dropped inputs take none of the next stage's slots", "[filter]") {
  virtual_loop loop;
  store_stage downstream;
  std::vector<int> stored;
  // 8 inputs checked 4 at a time (100 ms), the 4 kept ones stored 1 at a time
  // (1 s each): the store runs back to back from 100 ms, never for a dropped one.
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(sluice::map_unordered([&](int v) { return store(downstream, v); },
                                                    sluice::filter(keep_even{}, iota_vec(8), 4), 1),
                              [&](int v) { stored.push_back(v); });
  });
  std::sort(stored.begin(), stored.end());
  CHECK(stored == std::vector<int>{0, 2, 4, 6});
  CHECK(downstream.calls == 4);
  CHECK(downstream.most == 1);
  CHECK(loop.now() == 4100ms);

  SECTION("where map_unordered over the same function passes the empty ones on") {
    // The contrast: map_unordered yields every std::optional, so the next
    // stage is called (and takes a slot) for each dropped input too.
    virtual_loop loop2;
    store_stage pass_through;
    loop2.run([&]() -> asio::awaitable<void> {
      co_await sluice::for_each(
          sluice::map_unordered(
              [&](std::optional<int> v) { return store(pass_through, v.value_or(-1)); },
              sluice::map_unordered(keep_even{}, iota_vec(8), 4), 1),
          [](int) {});
    });
    CHECK(pass_through.calls == 8);
    CHECK(loop2.now() == 8100ms);
  }
}

TEST_CASE("a settling filter yields failures as outcomes and still drops the empty results",
          "[filter]") {
  virtual_loop loop;
  std::size_t values = 0, failures = 0;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(sluice::filter(
                                  [](int i) -> asio::awaitable<std::optional<int>> {
                                    co_await sluice::sleep(10ms);
                                    if (i == 3) throw std::runtime_error("bad input");
                                    if (i % 2 != 0) co_return std::nullopt;
                                    co_return i;
                                  },
                                  iota_vec(6), 2, sluice::return_exceptions),
                              [&](sluice::outcome<int> o) { (o ? values : failures) += 1; });
  });
  CHECK(values == 3);
  CHECK(failures == 1);
}

TEST_CASE("a failing filter fails fast as map_unordered does", "[filter]") {
  virtual_loop loop;
  CHECK_THROWS_WITH(loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(sluice::filter(
                                  [](int i) -> asio::awaitable<std::optional<int>> {
                                    co_await sluice::sleep(milliseconds(10 * (i + 1)));
                                    if (i == 1) throw std::runtime_error("bad input");
                                    co_return std::nullopt;
                                  },
                                  iota_vec(4), 4),
                              [](int) {});
  }),
                    "bad input");
  CHECK(loop.now() == 20ms);
}

TEST_CASE("filter with limit zero throws before anything starts", "[filter]") {
  CHECK_THROWS_AS(sluice::filter(keep_even{}, iota_vec(3), 0), std::invalid_argument);
}
