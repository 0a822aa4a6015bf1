// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_OPTIONS_HPP
#define SLUICE_REDIS_OPTIONS_HPP

#include <sluice/config.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace sluice::redis {

/// TLS for a Redis connection (`options::tls`), through `asio::ssl` (OpenSSL).
///
/// Needs `SLUICE_REDIS_TLS` defined in every translation unit that includes
/// a `sluice/redis` header, and OpenSSL linked: the CMake target
/// `sluice::redis_tls` does both (it is `sluice::redis` plus OpenSSL; Debian:
/// `libssl-dev`). Without it `sluice::redis` neither includes nor links
/// OpenSSL, and a connection whose options ask for TLS throws
/// `std::invalid_argument` when it is created.
///
/// The server's certificate is verified by default: its chain against
/// `ca_file`, and its name against `server_name`. Every socket of the
/// connection (each reconnect, each `connect_again()`, each node a Sentinel
/// connection reaches) does a full handshake before `AUTH`/`SELECT`.
///
/// @code
/// sluice::redis::options o{.host = "cache.internal", .port = 6380, .password = "secret",
///                          .tls = sluice::redis::tls_options{.ca_file = "ca.pem"}};
/// auto conn = co_await sluice::redis::connect(ex, o);   // TLS, then AUTH
/// @endcode
struct tls_options {
  /// PEM file of the CA certificate(s) that sign the server's certificate;
  /// empty: the system's default CA paths.
  std::string ca_file;
  /// PEM file of this client's certificate chain, for servers that
  /// authenticate clients (`tls-auth-clients yes`); empty: none.
  std::string cert_file;
  /// PEM file of the private key of `cert_file`; empty: `cert_file` holds it.
  std::string key_file;
  /// The name sent as SNI and checked against the server's certificate
  /// (DNS name, or IP address against an IP SAN); empty: `options::host`, or
  /// the address a Sentinel reported.
  std::string server_name;
  /// Verify the server's certificate chain and name. Turn it off only for a
  /// test: without it anybody on the path can read the traffic.
  bool verify = true;
};

/// Where and how `sluice::redis::connect(ex, options)` reaches a Redis server.
/// Everything here is applied again on every reconnect and on every connection
/// opened with `connection::connect_again()` (the semaphore's pub/sub
/// connection): the socket options, then `AUTH` and `SELECT` as the first
/// commands, pipelined ahead of the calls queued meanwhile.
///
/// Zero durations mean "no limit". A later Sentinel or Cluster connection
/// takes the same options for each node it opens.
///
/// @code
/// sluice::redis::options o{.host = "cache.internal", .port = 6380,
///                          .user = "svc", .password = "secret", .db = 2,
///                          .connect_timeout = std::chrono::seconds(2),
///                          .command_timeout = std::chrono::seconds(1)};
/// auto conn = co_await sluice::redis::connect(ex, o);
/// @endcode
struct options {
  /// Host name or numeric address; resolved once by `connect()` (reconnects
  /// reuse the addresses). Ignored when `unix_path` is set.
  std::string host = "127.0.0.1";
  /// TCP port.
  std::uint16_t port = 6379;
  /// A Unix domain socket path (`redis-server --unixsocket`); wins over
  /// `host`/`port` when not empty.
  std::string unix_path;
  /// ACL user name for `AUTH user password`; empty: `AUTH password` (the
  /// `default` user, `requirepass`).
  std::string user;
  /// Password; empty: no `AUTH` is sent.
  std::string password;
  /// Database index selected with `SELECT` after connecting (0: none sent).
  int db = 0;
  /// TLS (see `tls_options`); empty: plain TCP. Not for a Unix socket.
  std::optional<tls_options> tls;
  /// Limit on opening the socket (each reconnect too); past it the calls
  /// waiting for the connection fail with `errc::timed_out`.
  std::chrono::milliseconds connect_timeout{5000};
  /// Limit on the oldest unanswered call: when a reply is this late the
  /// server is taken as stalled or partitioned and the connection is reset:
  /// every call pending on it fails with `errc::timed_out` (they may or may
  /// not have run), the next call reconnects. Zero: wait for TCP. Set it
  /// above the longest blocking command you send (`BLPOP` ...).
  std::chrono::milliseconds command_timeout{5000};
  /// TCP keepalive (idle 15 s, then probes every 5 s, 3 probes) so that a
  /// silent peer is noticed even when no call is pending.
  bool keepalive = true;
};

/// One Redis Sentinel process (`redis-sentinel`, port 26379 by default).
struct sentinel_address {
  /// Host name or numeric address.
  std::string host = "127.0.0.1";
  /// The sentinel's port.
  std::uint16_t port = 26379;
};

/// How `connect_sentinel()` talks to the sentinels themselves (they have
/// their own password and TLS settings; the data nodes take `options`).
struct sentinel_options {
  /// ACL user for the sentinels' `AUTH`; empty: the default user.
  std::string user;
  /// The sentinels' password (`requirepass` in sentinel.conf); empty: none.
  std::string password;
  /// TLS to the sentinels (see `tls_options`); empty: plain TCP.
  std::optional<tls_options> tls;
  /// Limit on opening a connection to one sentinel.
  std::chrono::milliseconds connect_timeout{1000};
  /// Limit on one sentinel's answer.
  std::chrono::milliseconds command_timeout{1000};
  /// Subscribe to `+switch-master` on one sentinel, so that a failover
  /// moves the connections at once, even those whose old primary is still up.
  bool watch = true;
  /// How often every sentinel is asked again which node is the primary
  /// (each check waits at most this long, and `command_timeout`, for the
  /// answers). A node stays trusted for a `redis::semaphore` grant only
  /// while the sentinels' majority named it primary in a check sent less
  /// than the semaphore's restart grace ago (at least 0.6 s), so keep this
  /// well below that. Must be positive.
  std::chrono::milliseconds recheck{250};
};

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_OPTIONS_HPP
