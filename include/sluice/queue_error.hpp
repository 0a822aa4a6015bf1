// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_QUEUE_ERROR_HPP
#define SLUICE_QUEUE_ERROR_HPP

// The errors of sluice::queue (queue.hpp): queue_errc and queue_shut_down.

#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>

#include <string>
#include <system_error>
#include <type_traits>

namespace sluice {

/// Error codes of `sluice::queue` operations.
enum class queue_errc {
  shut_down = 1,  ///< the queue was shut down (Python's `QueueShutDown`)
};

/// The category of `queue_errc`.
inline const error_category& queue_category() noexcept {
  struct category final : error_category {
    const char* name() const noexcept override { return "sluice.queue"; }
    std::string message(int ev) const override {
      return ev == static_cast<int>(queue_errc::shut_down) ? "the queue was shut down"
                                                           : "unknown sluice.queue error";
    }
  };
  static const category instance;
  return instance;
}

/// Makes a `error_code` from a `queue_errc`.
inline error_code make_error_code(queue_errc e) noexcept {
  return {static_cast<int>(e), queue_category()};
}

}  // namespace sluice

#if defined(SLUICE_USE_BOOST_ASIO)
template <>
struct boost::system::is_error_code_enum<sluice::queue_errc> : std::true_type {};
#else
template <>
struct std::is_error_code_enum<sluice::queue_errc> : std::true_type {};
#endif

namespace sluice {

/// Thrown by `queue` members that put into a shut-down queue, or get from a
/// shut-down queue that is empty. Its code is `queue_errc::shut_down`, the
/// error the `async_*` operations report in the same situations.
class queue_shut_down : public system_error {
 public:
  /// `what` is the message; the code is always `queue_errc::shut_down`.
  explicit queue_shut_down(const char* what) : system_error(queue_errc::shut_down, what) {}
};

}  // namespace sluice

#endif  // SLUICE_QUEUE_ERROR_HPP
