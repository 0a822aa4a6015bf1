// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_RETRYABLE_HPP
#define SLUICE_RETRYABLE_HPP

// What a provider's refusal looks like to sluice (a throttle, a Retry-After
// hint) and which errors are worth another attempt: the vocabulary shared by
// sluice::retry, adaptive_limit's classifier and testing::slow_service.

#include <sluice/config.hpp>
#include <sluice/retry_after.hpp>
#include <sluice/time.hpp>
#include <sluice/timeout.hpp>

#include <sluice/detail/asio.hpp>

#include <algorithm>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace sluice {

/// A call the provider refused for now (HTTP 429, 503): retryable by default.
/// Throw it (or derive from it) where a client sees a throttle without a
/// hint; with a hint, derive from `sluice::retry_after` as well.
class throttled_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The default `retry_if`: true for a throttle (`sluice::throttled_error`), a
/// timeout (`sluice::timeout_error`, or a `system_error` whose code is
/// `asio::error::timed_out`), and any exception that carries a
/// `sluice::retry_after` hint. False for everything else, in particular for
/// `operation_aborted` (the caller's own cancellation or deadline) and for a
/// null pointer. Never throws.
[[nodiscard]] inline bool retryable(const std::exception_ptr& e) noexcept {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const retry_after&) {
    return true;
  } catch (const throttled_error&) {
    return true;
  } catch (const timeout_error&) {
    return true;
  } catch (const system_error& x) {
    return x.code() == asio::error::timed_out;
  } catch (...) {
    return false;
  }
}

/// The `retry_after` hint `e` carries, if any (negative hints read as zero).
[[nodiscard]] inline std::optional<clock::duration> retry_after_of(
    const std::exception_ptr& e) noexcept {
  if (!e) return std::nullopt;
  try {
    std::rethrow_exception(e);
  } catch (const retry_after& h) {
    return std::max<clock::duration>(h.after, clock::duration::zero());
  } catch (...) {
    return std::nullopt;
  }
}

/// What `sluice::retry` and `adaptive_limit::run` throw when the user's
/// judge of a failed call (`backoff::retry_if`, `run`'s `classify`) throws
/// instead of answering: the call's own error is not lost, it is the nested
/// exception (`std::rethrow_if_nested(e)` rethrows it, the same object), and
/// `callback_exception()` is what the judge threw. `what()` names the
/// callback and carries the judge's message.
///
/// @code
/// try {
///   co_await sluice::retry(policy, fn);
/// } catch (const sluice::callback_error& e) {
///   log(e.what());                 // "sluice::retry: retry_if threw: ..."
///   std::rethrow_if_nested(e);     // the call's own error
/// }
/// @endcode
class callback_error : public std::runtime_error {
 public:
  /// `what` for `what()`; `thrown` is the callback's exception.
  callback_error(const std::string& what, std::exception_ptr thrown)
      : std::runtime_error(what), thrown_(std::move(thrown)) {}
  /// The exception the callback threw.
  [[nodiscard]] const std::exception_ptr& callback_exception() const noexcept { return thrown_; }

 private:
  std::exception_ptr thrown_;
};

namespace detail {

// Called in the handler of a callback's exception (`who` names the
// callback): throws callback_error for it, with `original` (the error the
// callback was judging) as the nested exception.
[[noreturn]] inline void throw_callback_failure(const char* who,
                                                const std::exception_ptr& original) {
  std::exception_ptr thrown = std::current_exception();
  std::string what = std::string(who) + " threw: ";
  try {
    std::rethrow_exception(thrown);
  } catch (const std::exception& e) {
    what += e.what();
  } catch (...) {
    what += "an exception not derived from std::exception";
  }
  try {
    std::rethrow_exception(original);
  } catch (...) {
    std::throw_with_nested(callback_error(what, std::move(thrown)));
  }
}

}  // namespace detail

}  // namespace sluice

#endif  // SLUICE_RETRYABLE_HPP
