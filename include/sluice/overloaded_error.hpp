// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_OVERLOADED_ERROR_HPP
#define SLUICE_OVERLOADED_ERROR_HPP

#include <sluice/config.hpp>
#include <sluice/retry.hpp>

#include <stdexcept>
#include <string>

namespace sluice {

/// Thrown at once by a `sluice::shed` layer past its bound: the call was not
/// queued and took nothing. Carries a suggested Retry-After (a
/// `sluice::retry_after`), so `sluice::retryable` retries it and
/// `sluice::retry` waits exactly that long; a server answers it with HTTP 429
/// or 503 and `Retry-After: ceil(after)`.
class overloaded_error : public std::runtime_error, public retry_after {
 public:
  /// An overload; `after` is the suggested wait before trying again.
  explicit overloaded_error(clock::duration after, const char* why = "too many waiting")
      : std::runtime_error(std::string("sluice: overloaded: ") + why), retry_after{after} {}
};

}  // namespace sluice

#endif  // SLUICE_OVERLOADED_ERROR_HPP
