// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_SENTINEL_HPP
#define SLUICE_REDIS_SENTINEL_HPP

#include <sluice/config.hpp>
#include <sluice/redis/connection.hpp>
#include <sluice/redis/detail/io.hpp>
#include <sluice/redis/detail/script.hpp>
#include <sluice/redis/options.hpp>
#include <sluice/redis/reply.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_net.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace sluice::redis {

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

namespace sluice::detail {

// What one sentinel said of the master (SENTINEL MASTER <name>).
struct redis_sentinel_answer {
  bool answered = false;
  bool up = false;  // flags name a master that is not s_down / o_down
  long long epoch = -1;
  std::string host, port;
  std::string node() const { return host + ":" + port; }
};

// Finds the primary of one master name through the sentinels, re-checks it
// with all of them every `recheck`, and watches +switch-master; the
// redis_locator of every connection of one connect_sentinel() call (the
// returned one and its connect_again()s). Loop-affine.
//
// A check asks every sentinel at once (one connection each, kept open) and
// takes, among the answers that name a primary up, the one of the newest
// config epoch (an epoch changes only with a won failover election). That
// node is where connections go; it is confirmed (confirmed_at) only when a
// majority of all the sentinels named it at that epoch. A sentinel that has
// not answered within the check counts as silent; a silent watched sentinel
// loses the watch, which moves to the next one.
class redis_sentinel_locator final : public redis_locator,
                                     public std::enable_shared_from_this<redis_sentinel_locator> {
 public:
  using clock = std::chrono::steady_clock;

  redis_sentinel_locator(asio::any_io_executor ex, std::vector<redis::sentinel_address> sentinels,
                         std::string master, redis::sentinel_options so)
      : ex_(std::move(ex)),
        sentinels_(std::move(sentinels)),
        master_(std::move(master)),
        so_(std::move(so)),
        watch_timer_(ex_),
        recheck_timer_(ex_),
        queries_(sentinels_.size()) {}

  // The options of a connection to sentinel k.
  redis::options sentinel_options(std::size_t k) const {
    redis::options o;
    o.host = sentinels_.at(k).host;
    o.port = sentinels_.at(k).port;
    o.user = so_.user;
    o.password = so_.password;
    o.tls = so_.tls;
    o.connect_timeout = so_.connect_timeout;
    o.command_timeout = so_.command_timeout;
    return o;
  }

  // The address that connect_sentinel() found, for the first connect.
  void hint(found f) { hint_ = std::move(f); }

  clock::time_point confirmed_at(const std::string& node) const override {
    auto it = confirmed_.find(node);
    return it == confirmed_.end() ? clock::time_point::min() : it->second;
  }

  void locate(std::function<void(error_code, found)> done) override {
    if (closed_) {
      asio::post(ex_,
                 [d = std::move(done)] { d(redis::make_error_code(redis::errc::closed), {}); });
      return;
    }
    if (hint_) {
      asio::post(ex_, [d = std::move(done), f = std::move(*hint_)] { d(error_code{}, f); });
      hint_.reset();
      return;
    }
    locate_waiters_.push_back(std::move(done));
    if (locating_) return;  // one query at a time; every caller gets its answer
    locating_ = true;
    ++busy_;
    asio::co_spawn(ex_, find(shared_from_this()),
                   [self = shared_from_this()](std::exception_ptr, std::pair<error_code, found> r) {
                     self->locating_ = false;
                     auto waiters = std::move(self->locate_waiters_);
                     self->locate_waiters_.clear();
                     for (auto& w : waiters) w(r.first, r.second);
                     self->done_one();
                   });
  }

  void attach(const std::shared_ptr<redis_io>& io) override {
    ++attached_;
    std::erase_if(ios_, [](const std::weak_ptr<redis_io>& w) { return w.expired(); });
    ios_.push_back(io);
    if (closed_) return;
    if (so_.watch && !watching_) {
      watching_ = true;
      ++busy_;
      asio::co_spawn(ex_, watch(shared_from_this()),
                     [self = shared_from_this()](std::exception_ptr) { self->done_one(); });
    }
    if (!rechecking_) {
      rechecking_ = true;
      ++busy_;
      asio::co_spawn(ex_, recheck(shared_from_this()),
                     [self = shared_from_this()](std::exception_ptr) { self->done_one(); });
    }
  }

  void detach() override {
    if (attached_ > 0 && --attached_ == 0) close();
  }

  // While other connections of the group are open they own the locator's
  // I/O: only the last one to close waits for it.
  void wait_idle(std::function<void()> done) override {
    if (!closed_ || busy_ == 0) {
      asio::post(ex_, std::move(done));
      return;
    }
    idle_waiters_.push_back(std::move(done));
  }

  // One check (see the class comment): the primary of the newest epoch, or
  // no_primary if no sentinel names one that is up.
  static asio::awaitable<std::pair<error_code, found>> find(
      std::shared_ptr<redis_sentinel_locator> st) {
    std::pair<error_code, found> out;
    out.first = redis::make_error_code(redis::errc::no_primary);
    const auto sent = clock::now();
    auto op = ask_all(st, st->so_.command_timeout);  // named: g++ 12 and co_await operands
    auto answers = co_await std::move(op);
    auto best = st->judge(answers, sent);
    if (!best || st->closed_) co_return out;
    try {
      redis::options at;
      at.host = best->host;
      at.port = static_cast<std::uint16_t>(std::stoul(best->port));
      auto resolve_at = redis_resolve(st->ex_, at);
      out.second.endpoints = co_await std::move(resolve_at);
      out.second.host = best->host;
      out.second.port = best->port;
      out.first = error_code{};
    } catch (const std::exception&) {  // a malformed answer
    }
    co_return out;
  }

  // Ends the sentinel connections (connect_sentinel() failed: nothing attached).
  static asio::awaitable<void> close_queries(std::shared_ptr<redis_sentinel_locator> st) {
    st->closed_ = true;
    for (auto& q : st->queries_)
      if (auto c = std::exchange(q, nullptr)) co_await c->close();
  }

 private:
  struct round {
    explicit round(const asio::any_io_executor& ex, std::size_t n) : timer(ex), answers(n) {}
    asio::steady_timer timer;
    std::vector<redis_sentinel_answer> answers;
    std::size_t left = 0;
  };

  // Asks every sentinel at once; the answers that came within `within`.
  static asio::awaitable<std::vector<redis_sentinel_answer>> ask_all(
      std::shared_ptr<redis_sentinel_locator> st, std::chrono::milliseconds within) {
    const std::size_t n = st->sentinels_.size();
    auto r = std::make_shared<round>(st->ex_, n);
    for (std::size_t k = 0; k < n && !st->closed_; ++k) {
      if (!st->queries_[k]) {
        try {
          const redis::options so = st->sentinel_options(k);
          auto resolve = redis_resolve(st->ex_, so);
          auto eps = co_await std::move(resolve);
          if (!st->queries_[k] && !st->closed_)
            st->queries_[k] = std::make_shared<redis::connection>(
                std::make_shared<redis_io>(st->ex_, std::move(eps), true, so));
        } catch (const std::exception&) {
          continue;  // unresolvable: silent
        }
      }
      if (!st->queries_[k]) continue;
      ++r->left;
      st->queries_[k]->async_execute({"SENTINEL", "MASTER", st->master_},
                                     [r, k](error_code ec, redis::reply rep) {
                                       if (!ec && !rep.is_error()) r->answers[k] = parse(rep);
                                       if (--r->left == 0) r->timer.cancel();
                                     });
    }
    if (r->left > 0) {
      r->timer.expires_after(within);
      error_code ec;
      co_await r->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    co_return r->answers;
  }

  static redis_sentinel_answer parse(const redis::reply& r) {
    redis_sentinel_answer a;
    std::string flags;
    for (std::size_t i = 0; i + 1 < r.elements.size(); i += 2) {
      const std::string& field = r.elements[i].str;
      const std::string& value = r.elements[i + 1].str;
      if (field == "ip") a.host = value;
      if (field == "port") a.port = value;
      if (field == "flags") flags = value;
      if (field == "config-epoch") a.epoch = std::atoll(value.c_str());
    }
    a.answered = true;
    a.up = !a.host.empty() && !a.port.empty() && flags.find("master") != std::string::npos &&
           flags.find("s_down") == std::string::npos && flags.find("o_down") == std::string::npos;
    return a;
  }

  // Weighs one check sent at `sent`: records a majority's confirmation, moves
  // the connections to the newest primary, drops a silent watch. Returns the
  // newest primary that is up, if any sentinel named one.
  std::optional<redis_sentinel_answer> judge(const std::vector<redis_sentinel_answer>& answers,
                                             clock::time_point sent) {
    std::optional<redis_sentinel_answer> best;
    for (const auto& a : answers)
      if (a.up && (!best || a.epoch > best->epoch)) best = a;
    if (watch_io_ && !answers.at(watch_index_).answered) watch_io_->shutdown();  // silent
    if (!best) return best;
    std::size_t agree = 0;
    for (const auto& a : answers)
      agree += a.up && a.epoch == best->epoch && a.node() == best->node() ? 1 : 0;
    if (2 * agree > sentinels_.size()) {
      auto& at = confirmed_[best->node()];
      at = std::max(at, sent);
    }
    hint_.reset();
    for (auto& weak : std::vector<std::weak_ptr<redis_io>>(ios_))
      if (auto io = weak.lock()) io->relocate(best->host, best->port);
    return best;
  }

  // Checks the primary every so_.recheck (from send to send: a silent
  // sentinel does not stretch the period) until the group closes.
  static asio::awaitable<void> recheck(std::shared_ptr<redis_sentinel_locator> st) {
    auto next = clock::now();
    while (!st->closed_) {
      next = std::max(next + st->so_.recheck, clock::now());
      st->recheck_timer_.expires_at(next);
      error_code ec;
      co_await st->recheck_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      if (st->closed_) break;
      const auto sent = clock::now();
      auto op = ask_all(st, std::min(st->so_.recheck, st->so_.command_timeout));
      auto answers = co_await std::move(op);
      if (!st->closed_) st->judge(answers, sent);
    }
    for (auto& q : st->queries_)
      if (auto c = std::exchange(q, nullptr)) co_await c->close();
  }

  // Subscribed to +switch-master on one sentinel (the next one after a loss
  // or a silence) until the group closes.
  static asio::awaitable<void> watch(std::shared_ptr<redis_sentinel_locator> st) {
    std::size_t k = 0;
    while (!st->closed_) {
      try {
        st->watch_index_ = k % st->sentinels_.size();
        const redis::options so = st->sentinel_options(st->watch_index_);
        auto resolve = redis_resolve(st->ex_, so);
        auto eps = co_await std::move(resolve);
        auto io = std::make_shared<redis_io>(st->ex_, std::move(eps), true, so);
        auto c = std::make_shared<redis::connection>(io);
        st->watch_io_ = io;
        if (st->closed_) io->shutdown();
        std::weak_ptr<redis_sentinel_locator> weak = st;
        c->on_message([weak](const redis::reply& m) {
          if (auto s = weak.lock()) s->switched(m);
        });
        c->on_lost([weak] {
          if (auto s = weak.lock()) s->watch_timer_.cancel();
        });
        std::vector<std::string> cmd{"SUBSCRIBE", "+switch-master"};
        redis::reply r = co_await redis_call(*c, std::move(cmd));
        while (!r.is_error() && !st->closed_ && c->is_open()) {
          st->watch_timer_.expires_at(std::chrono::steady_clock::time_point::max());
          error_code ec;
          co_await st->watch_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        }
        co_await c->close();
      } catch (...) {
      }
      st->watch_io_.reset();
      if (st->closed_) break;
      ++k;
      st->watch_timer_.expires_after(std::chrono::milliseconds(200));
      error_code ec;
      co_await st->watch_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
  }

  // "+switch-master" payload: "<name> <old ip> <old port> <new ip> <new port>".
  void switched(const redis::reply& m) {
    std::vector<std::string> w;
    const std::string& s = m.elements.back().str;
    for (std::size_t i = 0; i < s.size();) {
      const std::size_t j = std::min(s.find(' ', i), s.size());
      w.push_back(s.substr(i, j - i));
      i = j + 1;
    }
    if (w.size() != 5 || w[0] != master_) return;
    hint_.reset();
    auto ios = ios_;
    for (auto& weak : ios)
      if (auto io = weak.lock()) io->relocate(w[3], w[4]);
  }

  void close() {
    closed_ = true;
    hint_.reset();
    watch_timer_.cancel();
    recheck_timer_.cancel();
    if (auto io = watch_io_) io->shutdown();
    if (!rechecking_) {  // else the recheck loop closes the sentinel connections
      rechecking_ = true;
      ++busy_;
      asio::co_spawn(ex_, close_queries(shared_from_this()),
                     [self = shared_from_this()](std::exception_ptr) { self->done_one(); });
    }
  }

  void done_one() {
    if (--busy_ != 0 || !closed_) return;
    auto waiters = std::move(idle_waiters_);
    idle_waiters_.clear();
    for (auto& w : waiters) asio::post(ex_, std::move(w));
  }

  asio::any_io_executor ex_;
  std::vector<redis::sentinel_address> sentinels_;
  std::string master_;
  redis::sentinel_options so_;
  asio::steady_timer watch_timer_;
  asio::steady_timer recheck_timer_;
  std::optional<found> hint_;
  std::vector<std::weak_ptr<redis_io>> ios_;
  std::vector<std::function<void(error_code, found)>> locate_waiters_;
  std::vector<std::function<void()>> idle_waiters_;
  std::vector<std::shared_ptr<redis::connection>> queries_;  // one per sentinel, kept open
  std::map<std::string, clock::time_point> confirmed_;       // node -> last majority check
  std::shared_ptr<redis_io> watch_io_;  // the sentinel subscribed to +switch-master
  std::size_t watch_index_ = 0;
  std::size_t attached_ = 0;
  std::size_t busy_ = 0;  // find(), watch() and recheck() coroutines running
  bool locating_ = false;
  bool watching_ = false;
  bool rechecking_ = false;
  bool closed_ = false;
};

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
/// Discovery: the sentinels are asked in order (the last one that answered
/// first) with `SENTINEL MASTER <name>` (the address of `SENTINEL
/// get-master-addr-by-name`, plus the sentinel's flags); the first that
/// reports the primary up (not `s_down`/`o_down`) wins. It is asked again
/// before every reconnect, so a lost connection, a `-READONLY` reply (the
/// node was demoted; the connection is reset after that call) and a
/// `+switch-master` message (one sentinel is watched; open connections to
/// the old primary are reset at once) all lead to the new primary. `o` is
/// applied to every node: `AUTH`, `SELECT`, TLS (its name check against
/// `tls_options::server_name`, else the address the sentinel reported),
/// timeouts. `connect_again()` (the semaphore's pub/sub connection) follows
/// the same primary.
///
/// During a failover calls fail as on any lost connection (`errc::connection_lost`,
/// the socket's error, or `errc::no_primary` while no sentinel reports a
/// primary that is up); the next call asks again. A promoted replica has its own
/// `run_id`, so a semaphore treats it as a restart: no new grant for one renewal interval + a
/// margin, while holders re-claim (see `semaphore`); fencing tokens keep increasing as long as the
/// servers' clocks agree within the failover time.
///
/// Throws `std::invalid_argument` for no sentinels, an empty name or a Unix
/// socket in `o`; `sluice::system_error` with `errc::no_primary` if no
/// sentinel reports a primary, or the connect error. Lifetime: the watcher
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
