// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_CLUSTER_HPP
#define SLUICE_REDIS_CLUSTER_HPP

#include <sluice/config.hpp>
#include <sluice/redis/connection.hpp>
#include <sluice/redis/detail/cluster_map.hpp>
#include <sluice/redis/options.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_net.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::redis {

/// The Redis Cluster hash slot of `key` (0..16383): CRC16 (XMODEM) of the
/// key, or of its `{hash tag}` (the text between the first `{` and the next
/// `}`, when not empty), modulo 16384. `key_slot("123456789") == 0x31C3 %
/// 16384`; `key_slot("{user1000}.following") == key_slot("{user1000}.followers")`.
/// Every key of one `sluice::redis::semaphore` or `rate_limiter` carries its
/// name as the hash tag, so all of them live in one slot, on one node.
[[nodiscard]] constexpr int key_slot(std::string_view key) noexcept {
  return sluice::detail::redis_key_slot(key);
}

/// Connects to a Redis Cluster: returns a `connection` (the same type
/// `connect()` returns, so `redis::semaphore` and `redis::rate_limiter` take
/// it unchanged) that sends each command to the primary serving its key's
/// slot, with one pipelined socket per node it uses, opened on first use.
///
/// `seeds` are some of the cluster's nodes (`{{"10.0.0.1", 7000}, ...}`); the
/// slot map is read with `CLUSTER SLOTS` from the first that answers, and
/// read again (from any node it knows) after a `MOVED`, a `CLUSTERDOWN` or a
/// lost node. `o` applies to every node's socket (AUTH, TLS, timeouts,
/// keepalive) on every reconnect; `o.host`/`o.port` are not used.
///
/// Routing, by the first key: `EVAL`/`EVALSHA`/`FCALL` the first key after
/// `numkeys`; `XREAD` the first stream; other commands their first argument.
/// Commands without a key (`PING`, `INFO`, `TIME`, `SCRIPT LOAD`, `PUBLISH`,
/// `SUBSCRIBE`, an `EVAL` with no key) go to the *default node*: the seed that
/// answered, or a node that serves slots if it stops serving any. Classic
/// pub/sub is cluster-wide, so `PUBLISH` and `SUBSCRIBE` work from there; use
/// `connect()` to reach one particular node for administration.
/// `MULTI`/`EXEC`/`DISCARD`/`WATCH`/`UNWATCH` throw `std::invalid_argument`
/// (each command may go to another node): use a Lua script whose keys share
/// a `{hash tag}`.
///
/// Redirects, followed without the caller seeing them:
/// - `MOVED slot host:port`: the slot's owner is updated at once, the map is
///   read again, and the command is sent to the new owner.
/// - `ASK slot host:port` (a slot being migrated): `ASKING` and the command are
///   sent to that node, for this command only.
/// - `TRYAGAIN` (a multi-key command whose keys are split by a migration),
///   `CLUSTERDOWN`, and a script aborted for touching a "non local key" (in
///   a migrating slot, a script that emptied a key and then wrote it again):
///   sent again after 1, 2, 4 ... 100 ms, for as long as `o.command_timeout`
///   (5 s if zero) from the call; then the error reply. An aborted script's
///   writes before that point stand (Redis does not roll back): sluice's
///   scripts only trimmed or re-drew a waiter's ticket by then; make your own
///   scripts safe to run again, or not delete and re-create keys.
/// - `NOSCRIPT` for a script this connection loaded (`SCRIPT LOAD` goes to the
///   default node, its source is remembered): loaded on that node, sent again.
/// At most 16 `MOVED`/`ASK` per call; past that the error reply is the result.
///
/// Order: the commands of one slot run in call order, as on one node (a
/// redirected command is sent again before any later command of its slot;
/// while one is redirected, later ones wait). Commands of different slots may
/// run in any order, on different nodes. One exception: while a migration has
/// moved some of one hash tag's keys but not the others (`MIGRATE` in several
/// batches), a command whose keys are all on one side may run before an
/// earlier one that got `TRYAGAIN`; move a hash tag's keys in one `MIGRATE`.
///
/// Failures and cancellation are those of `connection` (see its comment), per
/// node: a node's lost socket fails the calls sent to it (not retried: they
/// may have run) and triggers a map refresh; a call completes with
/// `operation_aborted` when cancelled, while its command (and its redirects)
/// still run. `is_open()`, `reconnect()`, `on_message()` and `on_lost()` are
/// about the default node's socket; `pending()` counts calls not yet
/// finished; `close()` closes every node's socket. `connect_again()` opens
/// an independent cluster connection (the semaphore's subscriber).
///
/// Throws `std::invalid_argument` if `seeds` is empty, `o.db != 0` (a cluster
/// has only database 0) or `o.unix_path` is set; `sluice::system_error` if
/// no seed could be reached (the last socket error, or `errc::handshake_failed`
/// when AUTH was refused); `server_error` if they answered with an error
/// (e.g. `ERR This instance has cluster support disabled`).
///
/// @code
/// auto conn = co_await sluice::redis::connect_cluster(ex, {{"10.0.0.1", 7000}, {"10.0.0.2",
/// 7000}},
///                                                     {.password = "secret"});
/// sluice::redis::semaphore cap{conn, "places-api", 5, std::chrono::seconds(10)};  // unchanged
/// @endcode
[[nodiscard]] inline asio::awaitable<std::shared_ptr<connection>> connect_cluster(
    asio::any_io_executor ex, std::vector<std::pair<std::string, std::uint16_t>> seeds, options o) {
  std::vector<sluice::detail::redis_node_addr> addrs;
  for (auto& [host, port] : seeds) {
    error_code ec;
    (void)asio::ip::make_address(host, ec);
    if (!ec) {
      addrs.push_back({host, port});
      continue;
    }
    asio::ip::tcp::resolver resolver(ex);
    auto results = co_await resolver.async_resolve(host, std::to_string(port), asio::use_awaitable);
    for (const auto& e : results)
      addrs.push_back({e.endpoint().address().to_string(), e.endpoint().port()});
  }
  // Named operation: g++ 12 may destroy a co_await operand's temporaries twice.
  auto op = sluice::detail::redis_cluster_open(std::move(ex), std::move(addrs), std::move(o));
  co_return co_await std::move(op);
}

/// As `connect_cluster(ex, seeds, options)` with the default `options`.
/// (Not a default argument: g++ 12 copies a coroutine's defaulted argument
/// bytewise.)
[[nodiscard]] inline asio::awaitable<std::shared_ptr<connection>> connect_cluster(
    asio::any_io_executor ex, std::vector<std::pair<std::string, std::uint16_t>> seeds) {
  options o;
  auto op = connect_cluster(std::move(ex), std::move(seeds), std::move(o));
  co_return co_await std::move(op);
}

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_CLUSTER_HPP
