// SPDX-License-Identifier: BSL-1.0
#include <sluice/concepts.hpp>
#include <sluice/gather.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/stream.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>
#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/lazy_tasks.hpp>

#include <chrono>
#include <cstddef>
#include <list>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace {
struct pages {
  asio::awaitable<std::optional<std::string>> next();
};
struct not_a_source {
  asio::awaitable<std::string> next();  // not an optional: no end marker
};
}  // namespace

TEST_CASE("the concepts accept tasks, ranges of tasks and async sources, and nothing else",
          "[concepts]") {
  STATIC_REQUIRE(sluice::task<asio::awaitable<int>>);
  STATIC_REQUIRE(sluice::task<asio::awaitable<void>&>);
  STATIC_REQUIRE_FALSE(sluice::task<int>);
  STATIC_REQUIRE(std::is_same_v<sluice::task_result_t<asio::awaitable<std::string>>, std::string>);

  STATIC_REQUIRE(sluice::task_range<std::vector<asio::awaitable<int>>>);
  STATIC_REQUIRE(sluice::task_range<std::list<asio::awaitable<void>>&>);
  STATIC_REQUIRE(sluice::task_range<sluice_test::lazy_tasks<asio::awaitable<int>>>);
  STATIC_REQUIRE_FALSE(sluice::task_range<std::vector<int>>);
  STATIC_REQUIRE_FALSE(sluice::task_range<asio::awaitable<int>>);

  STATIC_REQUIRE(sluice::async_source<pages>);
  STATIC_REQUIRE(std::is_same_v<sluice::async_source_value_t<pages>, std::string>);
  STATIC_REQUIRE(sluice::async_source<sluice::stream<int>>);
  STATIC_REQUIRE_FALSE(sluice::async_source<not_a_source>);
  STATIC_REQUIRE_FALSE(sluice::async_source<std::vector<int>>);
}

TEST_CASE("a range lending out stored tasks is told apart from a lazy range of tasks",
          "[concepts]") {
  using tasks = std::vector<asio::awaitable<int>>;
  using lazy = sluice_test::lazy_tasks<asio::awaitable<int>>;
  // Stored awaitables reachable by the caller: refused (pass std::move(tasks)).
  STATIC_REQUIRE(sluice::detail::lends_stored_tasks<tasks&>);
  STATIC_REQUIRE(sluice::detail::lends_stored_tasks<const tasks&>);
  STATIC_REQUIRE(sluice::detail::lends_stored_tasks<std::list<asio::awaitable<void>>&>);
  STATIC_REQUIRE(sluice::detail::lends_stored_tasks<std::span<asio::awaitable<int>>>);
  // Owned (moved in) or made on dereference: accepted.
  STATIC_REQUIRE_FALSE(sluice::detail::lends_stored_tasks<tasks>);
  STATIC_REQUIRE_FALSE(sluice::detail::lends_stored_tasks<tasks&&>);
  STATIC_REQUIRE_FALSE(sluice::detail::lends_stored_tasks<lazy&>);
  STATIC_REQUIRE_FALSE(sluice::detail::lends_stored_tasks<lazy>);
  // Not tasks at all: map_unordered's plain inputs stay accepted as lvalues.
  STATIC_REQUIRE_FALSE(sluice::detail::lends_stored_tasks<std::vector<int>&>);
}

namespace {
asio::awaitable<int> twice(std::size_t i) {
  co_await sluice::sleep(std::chrono::milliseconds(10));
  co_return static_cast<int>(2 * i);
}
}  // namespace

TEST_CASE("lazy ranges that make each task on dereference are accepted as lvalues", "[concepts]") {
  sluice::testing::virtual_loop loop;
  sluice_test::lazy_tasks<asio::awaitable<int>> lazy(3, twice);
  auto all = loop.run(sluice::gather(lazy));
  CHECK(all == std::vector<int>{0, 2, 4});
  sluice_test::lazy_tasks<asio::awaitable<int>> lazy2(3, twice);
  auto settled = loop.run(sluice::gather_with_concurrency(2, lazy2, sluice::return_exceptions));
  CHECK(settled.size() == 3);
  sluice_test::lazy_tasks<asio::awaitable<int>> lazy3(3, twice);
  auto sum = loop.run([&]() -> asio::awaitable<int> {
    auto s = sluice::as_completed(lazy3, 2);
    int total = 0;
    while (auto r = co_await s.next()) total += *r;
    co_return total;
  });
  CHECK(sum == 6);
#if !defined(__clang__)  // clang 14 cannot instantiate libstdc++ 12's std::views
  std::vector<std::size_t> ids{1, 2, 3};
  auto view = std::views::transform(ids, twice);
  auto viewed = loop.run(sluice::gather_with_concurrency(2, view));
  CHECK(viewed == std::vector<int>{2, 4, 6});
#endif
}
