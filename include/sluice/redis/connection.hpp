// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_CONNECTION_HPP
#define SLUICE_REDIS_CONNECTION_HPP

#include <sluice/config.hpp>
#include <sluice/redis/detail/cluster.hpp>
#include <sluice/redis/detail/io.hpp>
#include <sluice/redis/options.hpp>
#include <sluice/redis/reply.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_net.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace sluice::redis {
class connection;
}  // namespace sluice::redis

namespace sluice::detail {
asio::awaitable<std::shared_ptr<redis::connection>> redis_cluster_open(
    asio::any_io_executor ex, std::vector<redis_node_addr> seeds, redis::options opts);
}  // namespace sluice::detail

namespace sluice::redis {

/// One pipelined connection to a Redis server, shared by many coroutines.
///
/// Asio owns the socket (TCP or a Unix domain socket); hiredis only formats
/// commands (`redisFormatCommandArgv`) and parses replies (`redisReader`).
/// Every call appends its command to one ordered stream: commands are written
/// in call order, batched into as few writes as possible, and the n-th reply
/// completes the n-th call (Redis answers in order). Obtain one with
/// `sluice::redis::connect()`; it is held by `std::shared_ptr` so that the
/// cluster-wide primitives can share it.
///
/// What resumes where: a call completes through a post to its handler's
/// associated executor (a coroutine's own), else to the connection's executor;
/// never inline. Loop-affine: use a connection from the thread that runs its
/// executor.
///
/// Per-Operation Cancellation (terminal, partial, total): a cancelled call
/// completes at once with `asio::error::operation_aborted`, but its command
/// was (or will be) sent anyway and may run on the server: its reply is still
/// read and dropped, so the replies of later calls stay matched to their calls.
///
/// Failures:
/// - A server error reply (`-ERR ...`) is a normal reply: `async_execute`
///   delivers it with `reply::is_error()`; `execute()` throws `server_error`.
///   The connection stays usable.
/// - A lost connection (the server stopped, the network failed, a protocol
///   error) fails every call queued, written or waiting for a reply with
///   `errc::connection_lost` (`errc::protocol_error`; over TLS, an error
///   OpenSSL reports, e.g. the server's alert that it rejected the client's
///   certificate, arriving with the first reply: that error, in asio's ssl
///   category); none of them is retried, since a command may or may not have
///   run.
/// - Later calls reconnect: the first call after a loss opens a new socket to
///   the same endpoints (one attempt per call; no retry loop, no backoff). If
///   that attempt fails, the calls queued behind it fail with the socket's
///   error (e.g. `asio::error::connection_refused` while the server is down).
///   `reconnect()` does the same explicitly. `AUTH` and `SELECT` from the
///   `options` are sent again first on every new socket; other server-side
///   state that belonged to the old socket (SUBSCRIBE, MULTI) is not restored.
/// - A silent server (stopped, partitioned): when the oldest call has waited
///   `options::command_timeout`, the connection is reset and every pending
///   call fails with `errc::timed_out`; opening the socket is bounded by
///   `options::connect_timeout`. A rejected `AUTH`/`SELECT` fails the calls
///   with `errc::handshake_failed`.
///
/// Lifetime: the I/O (one read and at most one write outstanding) is owned by
/// the connection's internal state, never by a detached task. `close()` fails
/// the pending calls with `errc::closed`, closes the socket, and waits until
/// no socket operation is outstanding. Destroying the last handle without
/// `close()` closes the socket too; its aborted operations then complete on the
/// next turn of the loop and touch only that internal state. The executor's
/// execution context must outlive both.
///
/// @code
/// auto conn = co_await sluice::redis::connect(ex, "127.0.0.1", 6379);
/// co_await conn->execute("SET", "greeting", "hello");
/// sluice::redis::reply r = co_await conn->execute("GET", "greeting");   // r.str == "hello"
/// conn->async_execute({"INCR", "hits"}, [](sluice::error_code ec, sluice::redis::reply r) {});
/// co_await conn->close();
/// @endcode
class connection {
 public:
  /// The executor that runs the connection's I/O.
  using executor_type = asio::any_io_executor;

  /// Wraps an internal state; use `connect()` / `connect_unix()` instead.
  explicit connection(std::shared_ptr<sluice::detail::redis_io> io) noexcept : io_(std::move(io)) {}
  /// Wraps a cluster router; use `connect_cluster()` instead.
  explicit connection(std::shared_ptr<sluice::detail::redis_cluster> c) noexcept
      : cluster_(std::move(c)) {}
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  /// Closes the socket without waiting (see the class comment).
  ~connection() {
    if (cluster_) {
      cluster_->shutdown();
    } else {
      io_->shutdown();
    }
  }

  /// Sends one command (`args[0]` is its name, e.g. `{"GET", "key"}`) and
  /// completes with its reply. Completion signature
  /// `void(sluice::error_code, sluice::redis::reply)`; a Redis error reply is
  /// delivered with no error code and `reply::is_error()`. Throws
  /// `std::invalid_argument` at once for an empty command.
  template <asio::completion_token_for<void(error_code, reply)> CompletionToken>
  auto async_execute(std::vector<std::string> args, CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(error_code, reply)>(
        [io = io_.get(), cl = cluster_.get()](auto&& handler, std::vector<std::string> a) {
          if (cl != nullptr)
            return cl->submit(std::move(a), std::forward<decltype(handler)>(handler));
          io->submit(a, std::forward<decltype(handler)>(handler));
        },
        token, std::move(args));
  }

  /// Sends one command and returns its reply. Throws `sluice::system_error`
  /// when the call got no reply (see `errc`, or `operation_aborted` when
  /// cancelled) and `server_error` for an error reply.
  [[nodiscard]] asio::awaitable<reply> execute(std::vector<std::string> args) {
    error_code ec;
    auto token = asio::redirect_error(asio::use_awaitable, ec);
    // Named operation: g++ 12 may destroy a co_await operand's temporaries twice.
    auto op = async_execute(std::move(args), token);
    reply r = co_await std::move(op);
    if (ec) throw system_error(ec, "sluice::redis::connection::execute");
    if (r.is_error()) throw server_error(r.str);
    co_return r;
  }

  /// As `execute(std::vector<std::string>)`, with the command's words as
  /// arguments: `co_await conn->execute("SET", key, value)`. Each argument
  /// must convert to `std::string_view`; it is copied before this returns.
  /// (Prefer it in coroutines: g++ 12 cannot compile a braced list of string
  /// literals inside a `co_await` expression.)
  template <class... Args>
  requires(std::is_convertible_v<const Args&, std::string_view>&&...)
      [[nodiscard]] asio::awaitable<reply> execute(std::string_view name, const Args&... args) {
    std::vector<std::string> words;
    words.reserve(1 + sizeof...(Args));
    words.emplace_back(name);
    (words.emplace_back(std::string_view(args)), ...);
    return execute(std::move(words));
  }

  /// Opens the socket again after a loss; returns at once if it is open.
  /// Throws `sluice::system_error` with the connect error, or `errc::closed`
  /// after `close()`. Not cancellable (the socket's connect is short on a
  /// local network).
  [[nodiscard]] asio::awaitable<void> reconnect() {
    error_code ec;
    auto token = asio::redirect_error(asio::use_awaitable, ec);
    auto init = [io = io_.get(), cl = cluster_.get()](auto&& handler) {
      if (cl != nullptr) return cl->wait_open(std::forward<decltype(handler)>(handler));
      io->wait_open(std::forward<decltype(handler)>(handler));
    };
    auto op = asio::async_initiate<decltype(token), void(error_code)>(init, token);
    co_await std::move(op);
    if (ec) throw system_error(ec, "sluice::redis::connection::reconnect");
  }

  /// Fails the pending calls with `errc::closed`, closes the socket and waits
  /// until its I/O has ended. Later calls fail with `errc::closed`. Runs to the
  /// end even when the calling coroutine was cancelled.
  [[nodiscard]] asio::awaitable<void> close() {
    if (cluster_) {
      cluster_->shutdown();
    } else {
      io_->shutdown();
    }
    const bool was = co_await asio::this_coro::throw_if_cancelled();
    co_await asio::this_coro::throw_if_cancelled(false);
    auto token = asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable);
    auto init = [io = io_.get(), cl = cluster_.get()](auto&& handler) {
      if (cl != nullptr) return cl->wait_idle(std::forward<decltype(handler)>(handler));
      io->wait_idle(std::forward<decltype(handler)>(handler));
    };
    auto op = asio::async_initiate<decltype(token), void()>(init, token);
    co_await std::move(op);
    co_await asio::this_coro::throw_if_cancelled(was);
  }

  /// A new, independent connection to the same server (same endpoints, same
  /// options; for a `connect_sentinel()` connection: the current primary,
  /// followed across failovers), e.g. for SUBSCRIBE, which takes a connection
  /// for itself. Throws `sluice::system_error` if it cannot connect.
  [[nodiscard]] asio::awaitable<std::shared_ptr<connection>> connect_again() const {
    if (cluster_) {  // named operation: g++ 12 may destroy a co_await operand's temporaries twice
      auto op = sluice::detail::redis_cluster_open(cluster_->executor(), cluster_->primaries(),
                                                   cluster_->opts());
      co_return co_await std::move(op);
    }
    auto c = std::make_shared<connection>(io_->clone());
    co_await c->reconnect();
    co_return c;
  }

  /// Called with each pub/sub message (`["message", channel, payload]`)
  /// received after a `SUBSCRIBE` on this connection, from inside the
  /// connection's read handler: it must not block; it may post work. Cleared
  /// by `close()`.
  void on_message(std::function<void(const reply&)> f) {
    if (cluster_) return cluster_->on_message(std::move(f));
    io_->on_message(std::move(f));
  }
  /// Called when the connection is lost (before the next call reconnects),
  /// after the pending calls have been failed. Same rules as `on_message`.
  void on_lost(std::function<void()> f) {
    if (cluster_) return cluster_->on_lost(std::move(f));
    io_->on_lost(std::move(f));
  }

  /// True while the socket is open (false after a loss until a call
  /// reconnects, and after `close()`).
  [[nodiscard]] bool is_open() const noexcept {
    return (cluster_ ? cluster_->current() : io_->current()) ==
           sluice::detail::redis_io::state::open;
  }
  /// Calls sent or queued that have not had their reply yet (including
  /// cancelled ones whose reply is still to be read and dropped).
  [[nodiscard]] std::size_t pending() const noexcept {
    return cluster_ ? cluster_->pending() : io_->pending();
  }
  /// The executor that runs the connection's I/O.
  [[nodiscard]] executor_type get_executor() const noexcept {
    return cluster_ ? cluster_->executor() : io_->executor();
  }
  /// The options it was opened with (the defaults for `connect(ex, host, port)`).
  [[nodiscard]] const options& get_options() const noexcept {
    return cluster_ ? cluster_->opts() : io_->opts();
  }
  /// Through Sentinel (`connect_sentinel()`): the node the last call went to,
  /// as "host:port" in the sentinels' words; empty for other connections.
  [[nodiscard]] std::string node() const { return cluster_ ? std::string() : io_->node(); }
  /// Through Sentinel: the local send time of the last check in which a
  /// majority of the sentinels named `node` (a `node()` value) primary and
  /// none named another at the same or a newer epoch; `time_point::min()` if
  /// none did. For other connections (their node is the primary by
  /// configuration) `time_point::max()`. `redis::semaphore` counts a permit
  /// certain no longer than this + its restart grace.
  [[nodiscard]] std::chrono::steady_clock::time_point primary_confirmed_at(
      const std::string& node) const {
    if (cluster_ || !io_->locator()) return std::chrono::steady_clock::time_point::max();
    return io_->locator()->confirmed_at(node);
  }

 private:
  std::shared_ptr<sluice::detail::redis_io> io_;
  std::shared_ptr<sluice::detail::redis_cluster> cluster_;  // set: a cluster connection
};

}  // namespace sluice::redis

namespace sluice::detail {
// The endpoints of `o`: its Unix socket, its numeric host, or its host name
// resolved (once).
inline asio::awaitable<std::vector<redis_io::endpoint_type>> redis_resolve(
    asio::any_io_executor ex, const redis::options& o) {
  std::vector<redis_io::endpoint_type> eps;
  if (!o.unix_path.empty()) {
    eps.emplace_back(asio::local::stream_protocol::endpoint(o.unix_path));
    co_return eps;
  }
  error_code ec;
  const auto address = asio::ip::make_address(o.host, ec);
  if (!ec) {
    eps.emplace_back(asio::ip::tcp::endpoint(address, o.port));
  } else {
    asio::ip::tcp::resolver resolver(ex);
    auto results =
        co_await resolver.async_resolve(o.host, std::to_string(o.port), asio::use_awaitable);
    for (const auto& entry : results) eps.emplace_back(entry.endpoint());
  }
  co_return eps;
}

inline asio::awaitable<std::shared_ptr<redis::connection>> redis_open(
    asio::any_io_executor ex, std::vector<redis_io::endpoint_type> eps, bool tcp,
    redis::options opts) {
  auto c = std::make_shared<redis::connection>(
      std::make_shared<redis_io>(ex, std::move(eps), tcp, std::move(opts)));
  co_await c->reconnect();
  co_return c;
}

// A cluster connection: a router (redis_cluster) with the seeds as its first
// nodes, whose slot map is read (CLUSTER SLOTS) from the first seed that answers.
inline asio::awaitable<std::shared_ptr<redis::connection>> redis_cluster_open(
    asio::any_io_executor ex, std::vector<redis_node_addr> seeds, redis::options opts) {
  if (opts.db != 0)
    throw std::invalid_argument(
        "sluice::redis::connect_cluster: Redis Cluster has only database 0; options::db must be 0");
  if (!opts.unix_path.empty())
    throw std::invalid_argument(
        "sluice::redis::connect_cluster: cluster nodes are reached over TCP; options::unix_path "
        "must be empty");
  if (seeds.empty())
    throw std::invalid_argument("sluice::redis::connect_cluster: no seed node given");
  auto cl = std::make_shared<redis_cluster>(ex, std::move(opts));
  for (const auto& a : seeds) cl->node(a);
  auto init = [cl](auto&& handler) {
    cl->refresh(std::forward<decltype(handler)>(handler));
  };
  error_code ec;
  auto token = asio::redirect_error(asio::use_awaitable, ec);
  auto op = asio::async_initiate<decltype(token), void(error_code, std::string)>(init, token);
  const std::string text = co_await std::move(op);
  if (ec) {
    cl->shutdown();
    auto idle = [cl](auto&& handler) {
      cl->wait_idle(std::forward<decltype(handler)>(handler));
    };
    auto wait =
        asio::async_initiate<decltype(asio::use_awaitable), void()>(idle, asio::use_awaitable);
    co_await std::move(wait);
    if (ec == redis::make_error_code(redis::errc::protocol_error) && !text.empty())
      throw redis::server_error(text);
    throw system_error(ec, "sluice::redis::connect_cluster");
  }
  co_return std::make_shared<redis::connection>(std::move(cl));
}
}  // namespace sluice::detail

namespace sluice::redis {

/// Connects as `o` says (TCP to `o.host:o.port`, or the Unix socket
/// `o.unix_path`) and returns a shared handle whose I/O runs on `ex`. A
/// numeric host is used as is; a name is resolved once (reconnects reuse the
/// addresses). Sends `AUTH` / `SELECT` first when `o` asks for them, on this
/// and on every later socket. Throws `sluice::system_error`: the socket's
/// error if no address accepts the connection, `errc::timed_out` past
/// `o.connect_timeout`, `errc::handshake_failed` if `AUTH`/`SELECT` fail.
///
/// @code
/// sluice::redis::options o{.port = 6380, .password = "secret", .db = 1};
/// auto conn = co_await sluice::redis::connect(co_await asio::this_coro::executor, o);
/// @endcode
[[nodiscard]] inline asio::awaitable<std::shared_ptr<connection>> connect(asio::any_io_executor ex,
                                                                          options o) {
  const bool tcp = o.unix_path.empty();
  auto eps = co_await sluice::detail::redis_resolve(ex, o);
  const bool handshake = !o.password.empty() || o.db != 0;
  auto c = co_await sluice::detail::redis_open(ex, std::move(eps), tcp, std::move(o));
  if (handshake) co_await c->execute("PING");  // answered after AUTH/SELECT: they were accepted
  co_return c;
}

/// Connects to the Redis server at `host:port` over TCP (`TCP_NODELAY` on),
/// with the default `options` otherwise (no AUTH, no SELECT, 5 s connect and
/// command timeouts, keepalive); see `connect(ex, options)`.
///
/// @code
/// auto conn = co_await sluice::redis::connect(co_await asio::this_coro::executor, "127.0.0.1",
///                                             6379);
/// @endcode
[[nodiscard]] inline asio::awaitable<std::shared_ptr<connection>> connect(asio::any_io_executor ex,
                                                                          std::string host,
                                                                          std::uint16_t port) {
  options o;
  o.host = std::move(host);
  o.port = port;
  co_return co_await connect(std::move(ex), std::move(o));
}

/// Connects to the Redis server listening on the Unix domain socket at `path`
/// (`redis-server --unixsocket <path>`); otherwise as `connect()`.
[[nodiscard]] inline asio::awaitable<std::shared_ptr<connection>> connect_unix(
    asio::any_io_executor ex, std::string path) {
  options o;
  o.unix_path = std::move(path);
  co_return co_await connect(std::move(ex), std::move(o));
}

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_CONNECTION_HPP
