// SPDX-License-Identifier: BSL-1.0
// sluice::http_refusal_for: the HTTP answer of a call that did not return.
#include <sluice/http_status.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>

using namespace std::chrono_literals;

namespace {

template <class E>
sluice::http_refusal refusal(E e) {
  return sluice::http_refusal_for(std::make_exception_ptr(std::move(e)));
}

// A provider's own error that carries a hint (as a client maps a 503 with Retry-After).
struct unavailable : std::runtime_error, sluice::retry_after {
  explicit unavailable(sluice::clock::duration d)
      : std::runtime_error("provider: 503"), sluice::retry_after{d} {}
};

}  // namespace

TEST_CASE("a shed is a 429 whose Retry-After is the suggested wait rounded up", "[http_status]") {
  const auto r = refusal(sluice::overloaded_error(1500ms));
  CHECK(r.status == 429);
  CHECK(r.retry_after == 2s);
  CHECK(r.retry_after_text() == "2");
  CHECK(refusal(sluice::overloaded_error(3s)).retry_after == 3s);
  CHECK(refusal(sluice::overloaded_error(0s)).retry_after == 1s);  // at least 1
  CHECK(refusal(sluice::overloaded_error(sluice::clock::duration::max())).status == 429);
}

TEST_CASE("a refusal built from any duration saturates instead of overflowing at the call",
          "[http_status]") {
  CHECK(sluice::overloaded_error(std::chrono::hours::max()).after ==
        sluice::clock::duration::max());
  CHECK(sluice::overloaded_error(std::chrono::duration<double>(1.5)).after == 1500ms);
  CHECK(sluice::breaker_open_error(std::chrono::hours::max()).retry_in() ==
        sluice::clock::duration::max());
  CHECK(sluice::timeout_error(std::chrono::hours::max()).limit() == sluice::clock::duration::max());
  CHECK(refusal(sluice::overloaded_error(std::chrono::hours::max())).status == 429);
}

TEST_CASE("an open breaker is a 503 until its next trial", "[http_status]") {
  const auto r = refusal(sluice::breaker_open_error(2100ms));
  CHECK(r.status == 503);
  CHECK(r.retry_after == 3s);
  // Half-open with every trial taken: the next trial is at once; still 1 s.
  CHECK(refusal(sluice::breaker_open_error(0s)).retry_after == 1s);
}

TEST_CASE("a timeout is a 504 without Retry-After", "[http_status]") {
  const auto r = refusal(sluice::timeout_error(2s));
  CHECK(r.status == 504);
  CHECK(r.retry_after == 0s);
  CHECK(r.retry_after_text().empty());
}

TEST_CASE("a provider's throttle is a 503, with its own hint when it carries one",
          "[http_status]") {
  CHECK(refusal(sluice::throttled_error("provider: 429")).status == 503);
  CHECK(refusal(sluice::throttled_error("provider: 429")).retry_after == 1s);
  const auto r = refusal(unavailable(4200ms));
  CHECK(r.status == 503);
  CHECK(r.retry_after == 5s);
}

TEST_CASE("a cancelled call is a 503, a bug a 500, any other failure a 502", "[http_status]") {
  CHECK(refusal(sluice::system_error(sluice::asio::error::operation_aborted)).status == 503);
  CHECK(refusal(sluice::system_error(sluice::asio::error::connection_refused)).status == 502);
  CHECK(refusal(std::logic_error("over-release")).status == 500);
  CHECK(refusal(std::runtime_error("provider: ERROR")).status == 502);
  CHECK(refusal(42).status == 502);
  CHECK(refusal(std::runtime_error("x")).retry_after == 0s);
}

TEST_CASE("a server answers every refusal in one place", "[http_status]") {
  unsigned status = 0;
  std::string retry_after;
  auto reply = [&](unsigned s, std::string after) {
    status = s;
    retry_after = std::move(after);
  };
  // docs/provider-limits.md, "Call policies"
  try {
    throw sluice::overloaded_error(2s);
  } catch (...) {
    const sluice::http_refusal r = sluice::http_refusal_for(std::current_exception());
    reply(r.status, r.retry_after_text());  // 429 or 503 with Retry-After, 504, 502
  }
  CHECK(status == 429);
  CHECK(retry_after == "2");
}

TEST_CASE("no exception is a clear error", "[http_status]") {
  CHECK_THROWS_AS(sluice::http_refusal_for(nullptr), std::invalid_argument);
}

TEST_CASE("the errors that carry a duration state it in seconds, one format for both",
          "[http_status]") {
  CHECK(std::string(sluice::timeout_error(2500ms).what()) == "sluice: timed out after 2.500 s");
  CHECK(std::string(sluice::breaker_open_error(1250ms).what()) ==
        "sluice: circuit breaker open; next trial in 1.250 s");
}
