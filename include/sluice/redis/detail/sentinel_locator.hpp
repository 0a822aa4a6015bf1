// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_SENTINEL_LOCATOR_HPP
#define SLUICE_REDIS_DETAIL_SENTINEL_LOCATOR_HPP

// How a connect_sentinel() connection finds, re-checks and follows the
// primary: the sentinels' answers weighed by epoch and majority.

#include <sluice/config.hpp>
#include <sluice/redis/connection.hpp>
#include <sluice/redis/detail/io.hpp>
#include <sluice/redis/detail/locator.hpp>
#include <sluice/redis/detail/script.hpp>
#include <sluice/redis/options.hpp>
#include <sluice/redis/reply.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_net.hpp>
#include <sluice/detail/asio_timer.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_SENTINEL_LOCATOR_HPP
