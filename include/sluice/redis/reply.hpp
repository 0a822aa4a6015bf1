// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_REPLY_HPP
#define SLUICE_REDIS_REPLY_HPP

#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>

#include <stdexcept>
#include <string>
#include <vector>

namespace sluice::redis {

/// The errors of `sluice::redis` that are not the operating system's: the
/// error codes of a call that never got its reply. A call whose connection
/// could not be made at all reports the socket's own error instead (for
/// example `asio::error::connection_refused` while the server is down).
enum class errc {
  /// The connection broke (the server went away, the network failed) while
  /// the call was queued, written or waiting for its reply. The command may or
  /// may not have run on the server.
  connection_lost = 1,
  /// The connection was closed by `connection::close()` or by destroying its
  /// last handle; it accepts no more calls.
  closed,
  /// The server sent something that is not RESP, or a reply nobody asked for.
  /// The connection is dropped (the next call reconnects).
  protocol_error,
  /// The server did not answer within `options::command_timeout`, or the
  /// socket did not open within `options::connect_timeout`. The connection
  /// was reset (every call pending on it failed; each may or may not have
  /// run); the next call reconnects.
  timed_out,
  /// The server rejected the `AUTH` or `SELECT` sent after connecting (wrong
  /// password, unknown user, bad database). The connection is dropped.
  handshake_failed,
  /// A `connect_sentinel()` connection found no primary to connect to: no
  /// sentinel could be reached, or none reports the master name with a
  /// primary that is up (for example in the middle of a failover).
  no_primary,
};

}  // namespace sluice::redis

namespace sluice::detail {
class redis_category final : public error_category {
 public:
  const char* name() const noexcept override { return "sluice.redis"; }
  std::string message(int ev) const override {
    switch (static_cast<redis::errc>(ev)) {
      case redis::errc::connection_lost:
        return "sluice::redis: connection to the Redis server lost (the call may or may not "
               "have run; the next call reconnects)";
      case redis::errc::closed:
        return "sluice::redis: the connection was closed";
      case redis::errc::protocol_error:
        return "sluice::redis: protocol error (unexpected data from the server)";
      case redis::errc::timed_out:
        return "sluice::redis: the server did not answer in time (connection reset; the call may "
               "or may not have run)";
      case redis::errc::handshake_failed:
        return "sluice::redis: the server rejected AUTH or SELECT (check user, password, db)";
      case redis::errc::no_primary:
        return "sluice::redis: no sentinel reports a primary that is up for this master name";
    }
    return "sluice::redis: unknown error";
  }
};
}  // namespace sluice::detail

namespace sluice::redis {

/// The category of `sluice::redis::errc`.
inline const error_category& category() noexcept {
  static const sluice::detail::redis_category c;
  return c;
}

/// An `error_code` for `e` in `sluice::redis::category()`.
inline error_code make_error_code(errc e) noexcept {
  return error_code(static_cast<int>(e), category());
}

/// The RESP type of a reply. Types a RESP3 server may add are delivered as
/// `string` with their text.
enum class reply_kind { nil, string, status, error, integer, array };

/// One reply from the server, as a value (parsed by hiredis, then copied out of
/// hiredis's tree so that it owns no C memory).
struct reply {
  /// Its RESP type.
  reply_kind kind = reply_kind::nil;
  /// The value of an `integer` reply.
  long long integer = 0;
  /// The text of a `string`, `status` or `error` reply.
  std::string str;
  /// The elements of an `array` reply.
  std::vector<reply> elements;

  /// True for an error reply (`-ERR ...`, `-NOSCRIPT ...`).
  [[nodiscard]] bool is_error() const noexcept { return kind == reply_kind::error; }
  /// True for a nil reply.
  [[nodiscard]] bool is_nil() const noexcept { return kind == reply_kind::nil; }
};

/// Thrown by the awaitable `connection::execute()` (and the cluster-wide
/// primitives) when Redis answers with an error reply; `what()` is the
/// server's message, for example `"WRONGTYPE Operation against a key..."`.
/// The connection stays usable.
class server_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_REPLY_HPP
