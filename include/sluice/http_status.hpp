// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_HTTP_STATUS_HPP
#define SLUICE_HTTP_STATUS_HPP

#include <sluice/breaker.hpp>
#include <sluice/config.hpp>
#include <sluice/overloaded_error.hpp>
#include <sluice/retryable.hpp>
#include <sluice/timeout.hpp>

#include <sluice/detail/asio.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>

namespace sluice {

/// The HTTP answer of a server whose call to a provider did not return a
/// value: a status code and the `Retry-After` to send with it.
struct http_refusal {
  unsigned status = 502;  ///< 429, 500, 502, 503 or 504
  /// The `Retry-After` header's value in whole seconds (rounded up, at
  /// least 1); zero: send no `Retry-After`.
  std::chrono::seconds retry_after{0};

  /// `retry_after` as the header's text ("2"); empty when there is none.
  [[nodiscard]] std::string retry_after_text() const {
    return retry_after.count() > 0 ? std::to_string(retry_after.count()) : std::string();
  }
};

namespace detail {

inline std::chrono::seconds retry_after_seconds(clock::duration d) {
  return std::max(std::chrono::seconds(1), std::chrono::ceil<std::chrono::seconds>(d));
}

}  // namespace detail

/// What a server answers for the exception `e` of a call that went through
/// sluice's limits and call policies (the mapping every gateway writes):
///
/// | exception | status | Retry-After |
/// |---|---|---|
/// | `sluice::overloaded_error` (a shed: nothing was queued) | 429 Too Many Requests | its `after`
/// | | `sluice::breaker_open_error` (the call did not run) | 503 Service Unavailable | its
/// `retry_in()` | | `sluice::timeout_error` | 504 Gateway Timeout | none | | another exception
/// carrying `sluice::retry_after` | 503 | its `after` | | `sluice::throttled_error` (the provider's
/// throttle outlived the retries) | 503 | 1 s | | `operation_aborted` (the call was cancelled: the
/// server is stopping) | 503 | none | | `std::logic_error` (a bug on this side) | 500 Internal
/// Server Error | none | | anything else (the provider failed) | 502 Bad Gateway | none |
///
/// Retry-After is rounded up to whole seconds, at least 1. Throws
/// `std::invalid_argument` for a null `e`; never rethrows `e`.
///
/// @code
/// try {
///   res.body() = co_await provider([&] { return call_backend(req); });
/// } catch (...) {
///   const sluice::http_refusal r = sluice::http_refusal_for(std::current_exception());
///   res.result(r.status);
///   if (r.retry_after.count() > 0) res.set("Retry-After", r.retry_after_text());
/// }
/// @endcode
[[nodiscard]] inline http_refusal http_refusal_for(const std::exception_ptr& e) {
  if (!e) throw std::invalid_argument("sluice::http_refusal_for: no exception");
  try {
    std::rethrow_exception(e);
  } catch (const overloaded_error& x) {
    return {429, detail::retry_after_seconds(x.after)};
  } catch (const breaker_open_error& x) {
    return {503, detail::retry_after_seconds(x.retry_in())};
  } catch (const timeout_error&) {
    return {504};
  } catch (const retry_after& x) {
    return {503, detail::retry_after_seconds(x.after)};
  } catch (const throttled_error&) {
    return {503, std::chrono::seconds(1)};
  } catch (const system_error& x) {
    return {x.code() == asio::error::operation_aborted ? 503u : 502u};
  } catch (const std::logic_error&) {
    return {500};
  } catch (...) {
    return {502};
  }
}

}  // namespace sluice

#endif  // SLUICE_HTTP_STATUS_HPP
