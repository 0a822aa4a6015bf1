// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_SENTINEL_HPP
#define SLUICE_REDIS_SENTINEL_HPP

#include <sluice/config.hpp>
#include <sluice/redis/connection.hpp>
#include <sluice/redis/detail/io.hpp>
#include <sluice/redis/detail/sentinel_locator.hpp>
#include <sluice/redis/options.hpp>
#include <sluice/redis/reply.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_net.hpp>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace sluice::detail {

inline asio::awaitable<std::shared_ptr<redis::connection>> redis_connect_sentinel(
    asio::any_io_executor ex, std::vector<redis::sentinel_address> sentinels,
    std::string master_name, redis::options o, redis::sentinel_options so) {
  using redis::connection;
  if (sentinels.empty())
    throw std::invalid_argument("sluice::redis::connect_sentinel: no sentinel address");
  if (master_name.empty())
    throw std::invalid_argument("sluice::redis::connect_sentinel: empty master name");
  if (so.recheck.count() <= 0)
    throw std::invalid_argument("sluice::redis::connect_sentinel: sentinel_options::recheck <= 0");
  if (!o.unix_path.empty())
    throw std::invalid_argument("sluice::redis::connect_sentinel: a primary is reached over TCP");
  std::string where;
  for (const auto& s : sentinels)
    where += (where.empty() ? "" : ", ") + s.host + ":" + std::to_string(s.port);
  auto loc = std::make_shared<redis_sentinel_locator>(ex, std::move(sentinels), master_name,
                                                      std::move(so));
  (void)redis_io(ex, {}, true, loc->sentinel_options(0));  // bad TLS input throws
  // Named operation: g++ 12 may destroy a co_await operand's temporaries twice.
  auto op = redis_sentinel_locator::find(loc);
  auto first = co_await std::move(op);
  if (first.first) {
    auto closing = redis_sentinel_locator::close_queries(loc);
    co_await std::move(closing);
    throw system_error(first.first, "sluice::redis::connect_sentinel: master '" + master_name +
                                        "' via sentinels " + where);
  }
  const bool handshake = !o.password.empty() || o.db != 0;
  auto eps = first.second.endpoints;
  loc->hint(std::move(first.second));
  auto io = std::make_shared<redis_io>(ex, std::move(eps), true, std::move(o));
  io->set_locator(loc);
  auto c = std::make_shared<connection>(std::move(io));
  co_await c->reconnect();
  if (handshake) co_await c->execute("PING");  // answered after AUTH/SELECT: they were accepted
  co_return c;
}
}  // namespace sluice::detail

namespace sluice::redis {

/// Connects to the current primary of the Redis master `master_name`
/// monitored by `sentinels`, and follows it across failovers. Returns the
/// same `connection` type as `connect()`, so `semaphore` and `rate_limiter`
/// take it as they are.
///
/// Discovery: every sentinel is asked at once (one connection each, kept
/// open) with `SENTINEL MASTER <name>` (the address of `SENTINEL
/// get-master-addr-by-name`, plus the sentinel's flags and config epoch);
/// among the answers that report the primary up (not `s_down`/`o_down`) the
/// newest epoch wins. It is asked again before every reconnect and every
/// `sentinel_options::recheck`, so a lost connection, a `-READONLY` reply
/// (the node was demoted; the connection is reset after that call), a
/// `+switch-master` message (one sentinel is watched, the next one once it
/// is silent in a check) and a check that names another node all lead to the
/// new primary (open connections elsewhere are reset at once). `o` is applied
/// to every node: `AUTH`, `SELECT`, TLS (its name check against
/// `tls_options::server_name`, else the address the sentinel reported),
/// timeouts. `connect_again()` (the semaphore's pub/sub connection) follows
/// the same primary.
///
/// Confirmation: a node counts as the primary (`connection::primary_confirmed_at`)
/// from a check in which a majority of all the sentinels named it at the
/// newest epoch; a `semaphore` keeps grants and permits on it only until the
/// last such check + its restart grace, so a process whose watched sentinel
/// hung, or that still reaches a demoted primary, stops granting there before
/// the promoted node grants anything.
///
/// During a failover calls fail as on any lost connection (`errc::connection_lost`,
/// the socket's error, or `errc::no_primary` while no sentinel reports a
/// primary that is up); the next call asks again. A promoted replica has its own
/// `run_id`, so a semaphore treats it as a restart: no new grant for one renewal interval + a
/// margin, while holders re-claim and waiters ask again (see `semaphore`); fencing tokens keep
/// increasing whatever the servers' clocks, as the clients seed the new node with the highest
/// token they were granted.
///
/// Throws `std::invalid_argument` for no sentinels, an empty name, a Unix
/// socket in `o` or a `recheck` that is not positive; `sluice::system_error` with
/// `errc::no_primary` if no sentinel reports a primary, or the connect error. Lifetime: the watcher
/// and the sentinel queries belong to the returned connection and those
/// opened from it; the last of them to `close()` ends them and waits.
///
/// @code
/// sluice::redis::options o;
/// o.password = "secret";
/// auto conn = co_await sluice::redis::connect_sentinel(
///     ex, {{"10.0.0.1", 26379}, {"10.0.0.2", 26379}, {"10.0.0.3", 26379}}, "mymaster", o);
/// sluice::redis::semaphore cap{conn, "places-api", 5, std::chrono::seconds(5)};
/// @endcode
[[nodiscard]] inline asio::awaitable<std::shared_ptr<connection>> connect_sentinel(
    asio::any_io_executor ex, std::vector<sentinel_address> sentinels, std::string master_name,
    options o, sentinel_options so) {
  return sluice::detail::redis_connect_sentinel(
      std::move(ex), std::move(sentinels), std::move(master_name), std::move(o), std::move(so));
}

/// As above, with the default `sentinel_options` (no AUTH or TLS to the
/// sentinels, 1 s timeouts, `+switch-master` watched). (Overloads rather than
/// default arguments: g++ 12 mishandles a defaulted argument of class type in
/// a `co_await` expression.)
[[nodiscard]] inline asio::awaitable<std::shared_ptr<connection>> connect_sentinel(
    asio::any_io_executor ex, std::vector<sentinel_address> sentinels, std::string master_name,
    options o) {
  return sluice::detail::redis_connect_sentinel(std::move(ex), std::move(sentinels),
                                                std::move(master_name), std::move(o),
                                                sentinel_options{});
}

/// As above, with the default `options` for the primary as well.
[[nodiscard]] inline asio::awaitable<std::shared_ptr<connection>> connect_sentinel(
    asio::any_io_executor ex, std::vector<sentinel_address> sentinels, std::string master_name) {
  return sluice::detail::redis_connect_sentinel(
      std::move(ex), std::move(sentinels), std::move(master_name), options{}, sentinel_options{});
}

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_SENTINEL_HPP
