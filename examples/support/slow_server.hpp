// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_EXAMPLES_SUPPORT_SLOW_SERVER_HPP
#define SLUICE_EXAMPLES_SUPPORT_SLOW_SERVER_HPP

// A real slow provider over TCP on loopback, shared by examples/slow_server.cpp,
// examples/fanout_client.cpp, examples/http_gateway.cpp and
// tests/tcp_provider_test.cpp. It ships beside the examples and includes
// installed headers only: copy it with the example that includes it.
//
// Line protocol, one request per line:
//   GET <key>   ->  OK <key> <ms>        after a latency from the model
//               ->  THROTTLED <key>      at once, beyond the provider's limits
//                                        (in flight, per key, or a sliding-window
//                                        quota counted when the request arrives)
//               ->  ERROR <key>          at once, while the provider is failing
//   GET <key> <tokens>                   the same, weighing <tokens> against a
//                                        token quota (tokens_per_window)
//   FAIL 1      ->  OK FAIL 1            from now on every GET fails (an outage)
//   FAIL 0      ->  OK FAIL 0            and from now on it serves again
//   STATS       ->  STATS requests=<n> ok=<n> throttled=<n> max_concurrent=<n> collisions=<n>
//                   failed=<n>
// A "collision" is a request for a key that arrives while another request for
// the same key is in flight; with a log stream the server prints one line per
// collision ("[collision] key=... in flight=2"), as pynenc's demo does.
//
// The client side: request() opens one connection per call, so a fan-out that
// is not bounded shows up as open file descriptors.

#include <sluice/asio.hpp>
#include <sluice/outcome.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice_examples {

struct server_options {
  /// Latency of request number `index` (0-based, in arrival order) for `key`.
  std::function<std::chrono::milliseconds(std::string_view key, std::size_t index)> latency =
      [](std::string_view, std::size_t) {
        return std::chrono::milliseconds(10);
      };
  std::size_t throttle_above = 0;    ///< more requests than this at once: THROTTLED (0: never)
  std::size_t throttle_per_key = 0;  ///< more than this for one key at once: THROTTLED (0: never)
  /// A published quota: more than this many admitted requests arriving in any
  /// window (t - window, t] is THROTTLED (0: no quota), on the steady clock.
  std::size_t calls_per_window = 0;
  /// A token quota in the same window: `GET <key> <tokens>` beyond it is
  /// THROTTLED (0: none; requests without a count weigh 0).
  std::size_t tokens_per_window = 0;
  std::chrono::nanoseconds window{std::chrono::seconds(1)};
  std::ostream* log = nullptr;  ///< collision log (null: quiet)
};

struct server_stats {
  std::size_t requests = 0, ok = 0, throttled = 0, concurrent = 0, max_concurrent = 0,
              collisions = 0, failed = 0;
  std::map<std::string, std::size_t> max_per_key;
};

/// The server: accepts on 127.0.0.1:`port` (0: a free port) on `ctx`, one
/// coroutine per connection. Use it from the thread that runs `ctx`; read
/// stats() there or after that thread has finished.
class slow_server {
 public:
  slow_server(asio::io_context& ctx, server_options o, unsigned short port = 0)
      : ctx_(ctx),
        opt_(std::move(o)),
        acceptor_(ctx, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), port)) {}

  [[nodiscard]] unsigned short port() const { return acceptor_.local_endpoint().port(); }
  [[nodiscard]] const server_stats& stats() const noexcept { return stats_; }

  void start() { asio::co_spawn(ctx_, accept_loop(), asio::detached); }

  std::string stats_line() const {
    std::ostringstream o;
    o << "STATS requests=" << stats_.requests << " ok=" << stats_.ok
      << " throttled=" << stats_.throttled << " max_concurrent=" << stats_.max_concurrent
      << " collisions=" << stats_.collisions << " failed=" << stats_.failed;
    return o.str();
  }

 private:
  asio::awaitable<void> accept_loop() {
    for (;;) {
      sluice::error_code ec;
      asio::ip::tcp::socket s =
          co_await acceptor_.async_accept(asio::redirect_error(asio::use_awaitable, ec));
      if (ec == asio::error::operation_aborted) co_return;
      if (ec) continue;  // e.g. out of descriptors: drop this one, keep serving
      asio::co_spawn(ctx_, session(std::move(s)), asio::detached);
    }
  }

  asio::awaitable<void> session(asio::ip::tcp::socket s) {
    std::string buf;
    for (;;) {
      sluice::error_code ec;
      const std::size_t n = co_await asio::async_read_until(
          s, asio::dynamic_buffer(buf), '\n', asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
      std::string line = buf.substr(0, n - 1);
      buf.erase(0, n);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      std::string reply = co_await handle(line) + "\n";
      co_await asio::async_write(s, asio::buffer(reply),
                                 asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
    }
  }

  asio::awaitable<std::string> handle(const std::string& line) {
    if (line == "STATS") co_return stats_line();
    if (line == "FAIL 1" || line == "FAIL 0") {
      failing_ = line.back() == '1';
      co_return "OK " + line;
    }
    if (line.rfind("GET ", 0) != 0) co_return "ERR bad request";
    std::string key = line.substr(4);
    std::size_t tokens = 0;
    if (const auto sp = key.rfind(' '); opt_.tokens_per_window > 0 && sp != std::string::npos) {
      tokens = std::strtoul(key.c_str() + sp + 1, nullptr, 10);
      key.resize(sp);
    }
    const std::size_t index = stats_.requests++;
    const std::size_t here = ++stats_.concurrent;
    const std::size_t for_key = ++in_flight_[key];
    stats_.max_concurrent = std::max(stats_.max_concurrent, here);
    auto& m = stats_.max_per_key[key];
    m = std::max(m, for_key);
    if (for_key > 1) {
      ++stats_.collisions;
      if (opt_.log) *opt_.log << "[collision] key=" << key << " in flight=" << for_key << "\n";
    }
    std::string reply;
    if ((opt_.throttle_above > 0 && here > opt_.throttle_above) ||
        (opt_.throttle_per_key > 0 && for_key > opt_.throttle_per_key) || over_quota(tokens)) {
      ++stats_.throttled;
      reply = "THROTTLED " + key;
    } else if (failing_) {
      ++stats_.failed;
      reply = "ERROR " + key;
    } else {
      const auto d = opt_.latency(key, index);
      asio::steady_timer t(co_await asio::this_coro::executor, d);
      sluice::error_code ec;
      co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      ++stats_.ok;
      reply = "OK " + key + " " + std::to_string(d.count());
    }
    --stats_.concurrent;
    if (--in_flight_[key] == 0) in_flight_.erase(key);
    co_return reply;
  }

  // True if a request of `tokens` arriving now breaks a sliding-window quota;
  // else it is counted.
  bool over_quota(std::size_t tokens) {
    if (opt_.calls_per_window == 0 && opt_.tokens_per_window == 0) return false;
    const auto t = std::chrono::steady_clock::now();
    while (!admitted_.empty() && admitted_.front().first <= t - opt_.window) {
      used_tokens_ -= admitted_.front().second;
      admitted_.pop_front();
    }
    if (opt_.calls_per_window > 0 && admitted_.size() >= opt_.calls_per_window) return true;
    if (opt_.tokens_per_window > 0 && used_tokens_ + tokens > opt_.tokens_per_window) return true;
    admitted_.emplace_back(t, tokens);
    used_tokens_ += tokens;
    return false;
  }

  asio::io_context& ctx_;
  server_options opt_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::size_t>> admitted_;
  std::size_t used_tokens_ = 0;
  asio::ip::tcp::acceptor acceptor_;
  server_stats stats_;
  bool failing_ = false;
  std::map<std::string, std::size_t> in_flight_;
};

/// Client side: counts the connections this process has open (all threads).
struct client_sockets {
  std::size_t open = 0, max_open = 0;
};

/// One request on a new connection to 127.0.0.1:`port`: sends `line` and
/// returns the reply line ("OK key ms", "THROTTLED key", ...). Throws
/// system_error if the connection cannot be made (e.g. out of descriptors).
inline asio::awaitable<std::string> request(unsigned short port, std::string line,
                                            client_sockets* count = nullptr) {
  asio::ip::tcp::socket s(co_await asio::this_coro::executor);
  struct counted {
    client_sockets* c;
    explicit counted(client_sockets* x) : c(x) {
      if (c) c->max_open = std::max(c->max_open, ++c->open);
    }
    ~counted() {
      if (c) --c->open;
    }
  };
  s.open(asio::ip::tcp::v4());
  counted guard(count);
  co_await s.async_connect(asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), port),
                           asio::use_awaitable);
  line += '\n';
  co_await asio::async_write(s, asio::buffer(line), asio::use_awaitable);
  std::string buf;
  const std::size_t n =
      co_await asio::async_read_until(s, asio::dynamic_buffer(buf), '\n', asio::use_awaitable);
  buf.resize(n - 1);
  co_return buf;
}

/// How a batch of requests ended, from gather's return_exceptions results.
struct reply_tally {
  std::size_t ok = 0, throttled = 0, failed = 0;  // failed: no reply (e.g. out of descriptors)
  std::string first_failure;

  void add(const std::vector<sluice::outcome<std::string>>& replies) {
    for (const auto& r : replies) {
      if (!r) {
        ++failed;
        if (first_failure.empty()) {
          try {
            std::rethrow_exception(r.error());
          } catch (const std::exception& e) {
            first_failure = e.what();
          }
        }
      } else if (r.value().rfind("OK ", 0) == 0) {
        ++ok;
      } else {
        ++throttled;
      }
    }
  }
};

}  // namespace sluice_examples

#endif  // SLUICE_EXAMPLES_SUPPORT_SLOW_SERVER_HPP
