// SPDX-License-Identifier: BSL-1.0
#include <sluice/outcome.hpp>
#include <sluice/testing/slow_service.hpp>

#include <catch2/catch.hpp>

#include <memory>
#include <stdexcept>
#include <string>

TEST_CASE("an outcome holding a value gives it back and has no error", "[outcome]") {
  sluice::outcome<std::string> r = std::string("hello");
  CHECK(r.has_value());
  CHECK(static_cast<bool>(r));
  CHECK(r.value() == "hello");
  CHECK(*r == "hello");
  CHECK(r->size() == 5);
  CHECK(r.error() == nullptr);
}

TEST_CASE("an outcome holding an exception rethrows it from value()", "[outcome]") {
  sluice::outcome<int> r = std::make_exception_ptr(std::out_of_range("nope"));
  CHECK_FALSE(r.has_value());
  CHECK_FALSE(r);
  CHECK(r.error() != nullptr);
  CHECK_THROWS_AS(r.value(), std::out_of_range);
  CHECK_THROWS_WITH(*r, "nope");
}

TEST_CASE("outcome<void> is success by default and can hold an exception", "[outcome]") {
  sluice::outcome<void> ok;
  CHECK(ok.has_value());
  CHECK_NOTHROW(ok.value());
  sluice::outcome<void> bad = std::make_exception_ptr(std::runtime_error("bad"));
  CHECK_FALSE(bad);
  CHECK_THROWS_WITH(bad.value(), "bad");
}

TEST_CASE("an outcome refuses a null exception_ptr", "[outcome]") {
  CHECK_THROWS_AS(sluice::outcome<int>(std::exception_ptr{}), std::invalid_argument);
  CHECK_THROWS_AS(sluice::outcome<void>(std::exception_ptr{}), std::invalid_argument);
}

TEST_CASE("an outcome can hold a move-only value and move it out", "[outcome]") {
  sluice::outcome<std::unique_ptr<int>> r = std::make_unique<int>(7);
  std::unique_ptr<int> p = std::move(r).value();
  REQUIRE(p);
  CHECK(*p == 7);
}

TEST_CASE("error_as tells a throttle from another failure without a rethrow ladder", "[outcome]") {
  using sluice::testing::service_error;
  using sluice::testing::throttled_error;
  sluice::outcome<int> throttled =
      std::make_exception_ptr(throttled_error("429 too many requests", 3, "alice"));
  sluice::outcome<int> failed = std::make_exception_ptr(service_error("500 boom", 4, "bob"));
  sluice::outcome<int> other = std::make_exception_ptr(std::out_of_range("nope"));
  sluice::outcome<int> ok = 42;

  const throttled_error* t = throttled.error_as<throttled_error>();
  REQUIRE(t != nullptr);
  CHECK(t->index() == 3);
  CHECK(t->key() == "alice");
  CHECK(throttled.error_as<throttled_error>() == t);  // the held object, not a copy
  CHECK(throttled.error_as<service_error>() == t);    // a base type matches too
  CHECK(throttled.error_as<std::exception>() != nullptr);

  CHECK(failed.error_as<throttled_error>() == nullptr);
  REQUIRE(failed.error_as<service_error>() != nullptr);
  CHECK(failed.error_as<service_error>()->key() == "bob");
  CHECK(other.error_as<service_error>() == nullptr);
  CHECK(other.error_as<std::logic_error>() != nullptr);
  CHECK(ok.error_as<std::exception>() == nullptr);
}

TEST_CASE("error_as on outcome<void> is null on success and for another type", "[outcome]") {
  sluice::outcome<void> ok;
  sluice::outcome<void> bad = std::make_exception_ptr(std::runtime_error("bad"));
  CHECK(ok.error_as<std::exception>() == nullptr);
  CHECK(bad.error_as<std::logic_error>() == nullptr);
  REQUIRE(bad.error_as<std::runtime_error>() != nullptr);
  CHECK(std::string(bad.error_as<std::runtime_error>()->what()) == "bad");
}
