// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_SCRIPT_HPP
#define SLUICE_REDIS_DETAIL_SCRIPT_HPP

#include <sluice/config.hpp>
#include <sluice/redis/connection.hpp>

#include <sluice/detail/asio.hpp>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <unistd.h>

namespace sluice::detail {

// Whether a round trip follows the calling coroutine's cancellation. A
// cancelled round trip throws operation_aborted at once; its reply is still
// consumed by the connection (it stays matched), so the caller must undo
// what the command may have done with a later command (pipelined after it).
enum class redis_cancel { ignore, follow };

// One command. `ignore`: the round trip completes even if the caller is
// cancelled meanwhile (clean-up that must know whether a script ran); the
// connection's command_timeout still bounds it. Returns error replies as
// replies; throws system_error when there is no reply.
inline asio::awaitable<redis::reply> redis_call(redis::connection& conn,
                                                std::vector<std::string> cmd,
                                                redis_cancel mode = redis_cancel::ignore) {
  error_code ec;
  redis::reply r;
  if (mode == redis_cancel::ignore) {
    auto token = asio::bind_cancellation_slot(asio::cancellation_slot(),
                                              asio::redirect_error(asio::use_awaitable, ec));
    auto op = conn.async_execute(std::move(cmd), token);  // named: g++ 12 temporaries
    r = co_await std::move(op);
  } else {
    auto token = asio::redirect_error(asio::use_awaitable, ec);
    auto op = conn.async_execute(std::move(cmd), token);
    r = co_await std::move(op);
  }
  if (ec) throw system_error(ec, "sluice::redis");
  co_return r;
}

// A Lua script, loaded once per connection's server with SCRIPT LOAD and
// called with EVALSHA; loaded again on NOSCRIPT (a restarted server).
struct redis_script {
  const char* source;
  std::string sha;
};

inline std::vector<std::string> redis_evalsha(const std::string& sha,
                                              const std::vector<std::string>& keys,
                                              const std::vector<std::string>& args) {
  std::vector<std::string> cmd{"EVALSHA", sha, std::to_string(keys.size())};
  cmd.insert(cmd.end(), keys.begin(), keys.end());
  cmd.insert(cmd.end(), args.begin(), args.end());
  return cmd;
}

// Runs `s`; throws redis::server_error for an error reply, system_error when
// there is no reply (see redis_call for `mode`).
inline asio::awaitable<redis::reply> redis_eval(redis::connection& conn, redis_script& s,
                                                std::vector<std::string> keys,
                                                std::vector<std::string> args,
                                                redis_cancel mode = redis_cancel::ignore) {
  for (int attempt = 0;; ++attempt) {
    if (s.sha.empty()) {
      std::vector<std::string> load{"SCRIPT", "LOAD", s.source};
      redis::reply r = co_await redis_call(conn, std::move(load), mode);
      if (r.is_error()) throw redis::server_error(r.str);
      s.sha = r.str;
    }
    redis::reply r = co_await redis_call(conn, redis_evalsha(s.sha, keys, args), mode);
    if (r.is_error() && r.str.rfind("NOSCRIPT", 0) == 0 && attempt == 0) {
      s.sha.clear();
      continue;
    }
    if (r.is_error()) throw redis::server_error(r.str);
    co_return r;
  }
}

// Runs `s` from a callback, without a coroutine (a release from a destructor):
// EVALSHA if the script is known to be loaded, else EVAL. The request is
// owned by the connection; `done` gets whether it got a non-error reply.
template <class Done>
void redis_eval_detached_reply(redis::connection& conn, const redis_script& s,
                               const std::vector<std::string>& keys,
                               const std::vector<std::string>& args, Done done) {
  std::vector<std::string> cmd = redis_evalsha(s.sha, keys, args);
  if (s.sha.empty()) {
    cmd[0] = "EVAL";
    cmd[1] = s.source;
  }
  conn.async_execute(std::move(cmd),
                     [done = std::move(done)](error_code ec, redis::reply r) mutable {
                       done(!ec && !r.is_error());
                     });
}

// Throws std::invalid_argument for a name that would break the `{hash tag}`
// of the keys (all keys of one limit must share one Cluster slot): empty, or
// with braces other than one leading non-empty hash tag ("{account}:rpm").
inline void redis_check_name(const std::string& name, const char* who) {
  const auto close = name.find('}');
  const bool tagged = !name.empty() && name[0] == '{' && close != std::string::npos && close > 1 &&
                      name.find_first_of("{}", 1) == close &&
                      name.find_first_of("{}", close + 1) == std::string::npos;
  if (name.empty() || (name.find_first_of("{}") != std::string::npos && !tagged))
    throw std::invalid_argument(std::string(who) +
                                ": the name must be non-empty, with no '{' or '}' except one "
                                "leading hash tag such as \"{account}:rpm\" (the keys' {hash "
                                "tag} keeps a limit in one Cluster slot)");
}

// The key stem of a limit named `name` (checked by redis_check_name): the
// name is the hash tag, or carries its own ("{account}:rpm"), so limits that
// share a tag share a slot (one redis::acquire_all call needs that).
inline std::string redis_tagged(const char* prefix, const std::string& name) {
  return name[0] == '{' ? prefix + name : prefix + ("{" + name + "}");
}

// Throws std::invalid_argument for a count Lua cannot hold exactly (its
// numbers are doubles: integers are exact up to 2^53).
inline void redis_check_exact(std::uint64_t n, const char* who) {
  if (n > (std::uint64_t{1} << 53))
    throw std::invalid_argument(std::string(who) +
                                ": counts above 2^53 are not exact in Redis's Lua");
}

// An id unique across processes and hosts: 64 random bits, the pid and a
// per-process counter.
inline std::string redis_unique_id() {
  static const std::string prefix = [] {
    std::random_device rd;
    const std::uint64_t r = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    return std::to_string(r) + "-" + std::to_string(::getpid()) + "-";
  }();
  static std::atomic<std::uint64_t> counter{0};
  return prefix + std::to_string(++counter);
}

// Runs `a` with throw_if_cancelled off (restored after), so the caller's
// cancellation never interrupts clean-up; rethrows what `a` threw.
template <class T>
asio::awaitable<T> redis_without_throw_if_cancelled(asio::awaitable<T> a) {
  const bool was = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  std::exception_ptr e;
  std::optional<std::conditional_t<std::is_void_v<T>, int, T>> v;
  try {
    if constexpr (std::is_void_v<T>) {
      co_await std::move(a);
    } else {
      v.emplace(co_await std::move(a));
    }
  } catch (...) {
    e = std::current_exception();
  }
  co_await asio::this_coro::throw_if_cancelled(was);
  if (e) std::rethrow_exception(e);
  if constexpr (!std::is_void_v<T>) co_return std::move(*v);
}

// A handler that exposes a cancellation slot itself (co_spawn forwards the
// slot's cancellation into the coroutine at once on every Asio version).
template <class F>
struct redis_slot_handler {
  using cancellation_slot_type = asio::cancellation_slot;
  cancellation_slot_type slot;
  F f;
  cancellation_slot_type get_cancellation_slot() const noexcept { return slot; }
  template <class... Args>
  void operator()(Args&&... args) {
    f(std::forward<Args>(args)...);
  }
};

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_SCRIPT_HPP
