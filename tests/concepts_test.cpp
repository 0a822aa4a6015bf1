// SPDX-License-Identifier: BSL-1.0
#include <support/asio.hpp>
#include <sluice/concepts.hpp>
#include <sluice/stream.hpp>

#include <catch2/catch.hpp>
#include <support/lazy_tasks.hpp>

#include <list>
#include <optional>
#include <string>
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
