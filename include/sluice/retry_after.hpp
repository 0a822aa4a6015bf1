// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_RETRY_AFTER_HPP
#define SLUICE_RETRY_AFTER_HPP

// The Retry-After hint an error carries: a vocabulary type of its own, so
// that the limits that shed (overloaded_error.hpp) name it without the retry
// machinery (retryable.hpp includes timeout.hpp).

#include <sluice/config.hpp>
#include <sluice/detail/virtual_clock.hpp>

namespace sluice {

/// The hint a provider gives with a refusal: "try again after `after`" (HTTP
/// `Retry-After`). An exception carries it by deriving from it, beside its
/// usual base:
///
/// @code
/// struct http_429 : std::runtime_error, sluice::retry_after {
///   http_429(std::string what, sluice::clock::duration d)
///       : std::runtime_error(std::move(what)), sluice::retry_after{d} {}
/// };
/// @endcode
///
/// `sluice::retryable` retries such an error, and `sluice::retry` waits exactly
/// `after` before the next attempt (the hint wins over the backoff; a negative
/// hint counts as zero). `sluice::testing::throttled_error` carries one.
struct retry_after {
  /// How long the provider asks the caller to wait (any duration: a
  /// `sluice::saturating_duration`).
  detail::saturating_duration after{};
};

}  // namespace sluice

#endif  // SLUICE_RETRY_AFTER_HPP
