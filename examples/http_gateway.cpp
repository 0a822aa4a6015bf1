// SPDX-License-Identifier: BSL-1.0
// An HTTP/1.1 gateway (Boost.Beast) in the shape of a real Asio service: one
// io_context run by N threads, each connection's session on a strand of its
// own. Every request `GET /item/<key>?user=<user>` is answered by calling the
// slow TCP provider (examples/slow_server) under limits shared by all
// sessions through sluice::strand_bound:
//
//   - a global rate      strand_bound<rate_limiter>{strand, rate, 1s}
//   - a per-user limit   strand_bound<keyed_semaphore<std::string>>{strand, 2}
//   - single-flight      strand_bound<single_flight<std::string, std::string>> per shard
//                        (the key's hash picks one of `threads` shards, each on its own
//                        strand): one provider call per key at a time
//   - in flight at the provider: sluice::shared_semaphore{cap} (a plain count)
//   - a per-call timeout (sluice::with_timeout) and sluice::retry of throttles
//     and timeouts (3 attempts)
//
// Outcome -> HTTP: 200 with the provider's reply; 429 with Retry-After when
// the user's own queue is already `--queue` long; 504 when the provider call
// timed out (after the retries); 503 if it stayed throttled; 404 for another
// path.
//
//   http_gateway --provider-port P [--port 0] [--threads 4] [--rate 5000]
//                [--per-user 2] [--cap 8] [--queue 16] [--timeout-ms 2000]
//       serves on 127.0.0.1 until SIGINT/SIGTERM, then stops accepting, closes
//       idle connections, lets running requests finish, and prints its counts
//   http_gateway --virtual
//       a short self-contained run: an in-process provider, the gateway on 4
//       threads, 96 requests from an in-process HTTP client; checks zero
//       provider throttles and at most `cap` calls in flight at the provider
//
// Load test (tests/load/http_gateway_load.py, CTest `http_gateway_load`):
// drives it with `wrk` against a real slow_server process.

#ifndef SLUICE_USE_BOOST_ASIO
#error "http_gateway uses Boost.Beast: build it with SLUICE_USE_BOOST_ASIO"
#endif

#include <sluice/asio.hpp>
#include <sluice/gather.hpp>
#include <sluice/keyed_semaphore.hpp>
#include <sluice/rate_limiter.hpp>
#include <sluice/retry.hpp>
#include <sluice/shared_semaphore.hpp>
#include <sluice/single_flight.hpp>
#include <sluice/strand_bound.hpp>
#include <sluice/timeout.hpp>

#include "support/slow_server.hpp"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

struct options {
  unsigned short port = 0, provider_port = 7777;
  int threads = 4;
  std::size_t rate = 5000;  // provider calls started per second, all sessions together
  std::size_t per_user = 2;
  std::size_t cap = 8;  // calls in flight at the provider
  std::size_t queue = 16;
  std::chrono::milliseconds timeout{2000};
};

// What the gateway answered, counted across threads.
struct tally {
  std::atomic<std::size_t> ok{0}, busy{0}, timed_out{0}, throttled{0}, other{0};
};

class gateway {
  using flights = sluice::strand_bound<sluice::single_flight<std::string, std::string>>;

 public:
  gateway(asio::io_context& ctx, options o)
      : opt_(o),
        rps_(asio::make_strand(ctx), o.rate, 1s),
        per_user_(asio::make_strand(ctx), o.per_user),
        provider_cap_(o.cap) {
    for (int i = 0; i < o.threads; ++i)
      shards_.push_back(std::make_unique<flights>(asio::make_strand(ctx)));
  }

  [[nodiscard]] const tally& counts() const noexcept { return counts_; }

  // Answers one request; `req` must outlive the call (the session's frame).
  asio::awaitable<http::response<http::string_body>> handle(
      const http::request<http::string_body>& req) {
    http::response<http::string_body> res{http::status::ok, req.version()};
    res.set(http::field::content_type, "text/plain");
    const std::string_view target = req.target();
    const auto q = target.find("?user=");
    if (req.method() != http::verb::get || target.rfind("/item/", 0) != 0 ||
        q == std::string_view::npos) {
      res.result(http::status::not_found);
      res.body() = "GET /item/<key>?user=<user>\n";
      co_return res;
    }
    const std::string key(target.substr(6, q - 6)), user(target.substr(q + 6));
    // Shed load before it queues: the user's own queue is long enough.
    if (co_await per_user_.waiters(user) >= opt_.queue) {
      ++counts_.busy;
      res.result(http::status::too_many_requests);
      res.set(http::field::retry_after, "1");
      co_return res;
    }
    try {
      co_await rps_.acquire();                                // the global rate
      auto permit = co_await per_user_.scoped_acquire(user);  // 2 per user at once
      auto fetch = [this, key] {
        return fetch_from_provider(key);
      };
      res.body() = co_await shard(key).run(key, fetch) + "\n";  // one call per key at a time
      ++counts_.ok;
    } catch (const sluice::timeout_error&) {
      ++counts_.timed_out;
      res.result(http::status::gateway_timeout);
    } catch (const sluice::throttled_error&) {
      ++counts_.throttled;
      res.result(http::status::service_unavailable);
      res.set(http::field::retry_after, "1");
    }
    co_return res;
  }

 private:
  flights& shard(const std::string& key) {
    return *shards_[std::hash<std::string>{}(key) % shards_.size()];
  }

  // The shared work of one key: runs on its shard's strand. Each attempt
  // takes a provider slot and has its own deadline; throttles and timeouts
  // are retried.
  asio::awaitable<std::string> fetch_from_provider(std::string key) {
    auto attempt = [this, key] {
      return provider_attempt(key);
    };
    auto call = sluice::retry(
        sluice::backoff{.first = 20ms, .max = 200ms, .attempts = 3, .jitter = sluice::full_jitter},
        attempt);
    co_return co_await std::move(call);
  }

  asio::awaitable<std::string> provider_attempt(std::string key) {
    auto slot = co_await provider_cap_.scoped_acquire();
    auto request = sluice_examples::request(opt_.provider_port, "GET " + key);
    std::string reply = co_await sluice::with_timeout(opt_.timeout, std::move(request));
    if (reply.rfind("THROTTLED", 0) == 0) throw sluice::throttled_error("provider: " + reply);
    co_return reply;
  }

  options opt_;
  sluice::strand_bound<sluice::rate_limiter> rps_;
  sluice::strand_bound<sluice::keyed_semaphore<std::string>> per_user_;
  std::vector<std::unique_ptr<flights>> shards_;
  sluice::shared_semaphore provider_cap_;
  tally counts_;
};

// The listener and the sessions, with a graceful stop: stop() closes the
// acceptor and every connection; requests already running finish, then the
// io_context runs out of work.
class server {
 public:
  server(asio::io_context& ctx, gateway& g, unsigned short port)
      : ctx_(ctx),
        g_(g),
        acceptor_strand_(asio::make_strand(ctx)),
        acceptor_(acceptor_strand_, tcp::endpoint(asio::ip::address_v4::loopback(), port)) {}

  [[nodiscard]] unsigned short port() const { return acceptor_.local_endpoint().port(); }

  void start() { asio::co_spawn(acceptor_strand_, listen(), asio::detached); }

  // From any thread.
  void stop() {
    asio::post(acceptor_strand_, [this] {
      sluice::error_code ec;
      acceptor_.close(ec);
    });
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : open_) {
      if (auto s = w.lock()) {
        asio::post(s->get_executor(), [s] {
          sluice::error_code ec;
          s->socket().close(ec);
        });
      }
    }
  }

 private:
  asio::awaitable<void> listen() {
    for (;;) {
      sluice::error_code ec;
      tcp::socket socket = co_await acceptor_.async_accept(
          asio::make_strand(ctx_), asio::redirect_error(asio::use_awaitable, ec));
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
      if (ec) continue;
      auto stream = std::make_shared<beast::tcp_stream>(std::move(socket));
      {
        std::lock_guard<std::mutex> lock(mu_);
        std::erase_if(open_, [](const auto& w) { return w.expired(); });
        open_.push_back(stream);
      }
      asio::co_spawn(stream->get_executor(), session(stream), asio::detached);
    }
  }

  // One connection, on its own strand: keep-alive requests one after another.
  asio::awaitable<void> session(std::shared_ptr<beast::tcp_stream> stream) {
    beast::flat_buffer buffer;
    for (;;) {
      http::request<http::string_body> req;
      sluice::error_code ec;
      stream->expires_after(30s);
      co_await http::async_read(*stream, buffer, req,
                                asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
      stream->expires_never();
      http::response<http::string_body> res = co_await g_.handle(req);
      res.keep_alive(req.keep_alive());
      res.prepare_payload();
      co_await http::async_write(*stream, res, asio::redirect_error(asio::use_awaitable, ec));
      if (ec || !res.keep_alive()) break;
    }
    sluice::error_code ec;
    stream->socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  asio::io_context& ctx_;
  gateway& g_;
  asio::strand<asio::io_context::executor_type> acceptor_strand_;
  tcp::acceptor acceptor_;
  std::mutex mu_;
  std::vector<std::weak_ptr<beast::tcp_stream>> open_;
};

void run_threads(asio::io_context& ctx, int threads) {
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back([&ctx] { ctx.run(); });
  ctx.run();
  for (auto& t : pool) t.join();
}

void print_counts(const gateway& g) {
  const tally& c = g.counts();
  std::printf("gateway: 200 %zu, 429 %zu, 504 %zu, 503 %zu\n", c.ok.load(), c.busy.load(),
              c.timed_out.load(), c.throttled.load());
}

// One HTTP GET on a new connection; returns the status code.
asio::awaitable<unsigned> http_get(unsigned short port, std::string target) {
  beast::tcp_stream stream(co_await asio::this_coro::executor);
  co_await stream.async_connect(tcp::endpoint(asio::ip::address_v4::loopback(), port),
                                asio::use_awaitable);
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "127.0.0.1");
  req.keep_alive(false);
  co_await http::async_write(stream, req, asio::use_awaitable);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  co_await http::async_read(stream, buffer, res, asio::use_awaitable);
  co_return res.result_int();
}

int self_contained() {
  // The provider: one thread of its own (its statistics are loop-affine).
  asio::io_context provider_ctx;
  sluice_examples::server_options po;
  po.latency = [](std::string_view, std::size_t i) {
    return std::chrono::milliseconds(5 + static_cast<long>(i % 20));
  };
  options o;
  o.threads = 4;
  o.cap = 4;
  po.throttle_above = o.cap;  // more than `cap` at once would be throttled
  po.throttle_per_key = 1;    // so would two calls for one key
  sluice_examples::slow_server provider(provider_ctx, po);
  provider.start();
  std::thread provider_thread([&] { provider_ctx.run(); });
  o.provider_port = provider.port();

  asio::io_context ctx(o.threads);
  gateway g(ctx, o);
  server srv(ctx, g, 0);
  srv.start();
  std::printf("[virtual] gateway on 127.0.0.1:%u (%d threads), provider on 127.0.0.1:%u\n",
              static_cast<unsigned>(srv.port()), o.threads, static_cast<unsigned>(o.provider_port));
  std::vector<unsigned> statuses;
  std::exception_ptr failure;
  asio::co_spawn(
      asio::make_strand(ctx),
      [&]() -> asio::awaitable<void> {
        std::vector<asio::awaitable<unsigned>> calls;
        for (int i = 0; i < 96; ++i) {
          calls.push_back(http_get(srv.port(), "/item/key" + std::to_string(i % 12) + "?user=user" +
                                                   std::to_string(i % 6)));
        }
        statuses = co_await sluice::gather_with_concurrency(32, std::move(calls));
      },
      [&](std::exception_ptr e) {
        failure = e;
        srv.stop();
      });
  run_threads(ctx, o.threads);
  provider_ctx.stop();
  provider_thread.join();
  if (failure) std::rethrow_exception(failure);
  print_counts(g);
  const auto& s = provider.stats();
  std::printf("provider: requests %zu, ok %zu, throttled %zu, max in flight %zu (cap %zu)\n",
              s.requests, s.ok, s.throttled, s.max_concurrent, o.cap);
  std::size_t ok = 0;
  for (unsigned st : statuses) ok += st == 200;
  std::printf("HTTP 200: %zu of %zu\n", ok, statuses.size());
  return ok == statuses.size() && s.throttled == 0 && s.max_concurrent <= o.cap ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--virtual") return self_contained();
    if (i + 1 >= argc) break;
    const char* v = argv[++i];
    if (a == "--port")
      o.port = static_cast<unsigned short>(std::atoi(v));
    else if (a == "--provider-port")
      o.provider_port = static_cast<unsigned short>(std::atoi(v));
    else if (a == "--threads")
      o.threads = std::max(1, std::atoi(v));
    else if (a == "--rate")
      o.rate = std::strtoul(v, nullptr, 10);
    else if (a == "--per-user")
      o.per_user = std::strtoul(v, nullptr, 10);
    else if (a == "--cap")
      o.cap = std::strtoul(v, nullptr, 10);
    else if (a == "--queue")
      o.queue = std::strtoul(v, nullptr, 10);
    else if (a == "--timeout-ms")
      o.timeout = std::chrono::milliseconds(std::atoi(v));
  }
  asio::io_context ctx(o.threads);
  gateway g(ctx, o);
  server srv(ctx, g, o.port);
  srv.start();
  asio::signal_set signals(ctx, SIGINT, SIGTERM);
  signals.async_wait([&](sluice::error_code, int) { srv.stop(); });
  std::printf("listening on 127.0.0.1:%u (%d threads; provider 127.0.0.1:%u)\n",
              static_cast<unsigned>(srv.port()), o.threads, static_cast<unsigned>(o.provider_port));
  std::fflush(stdout);
  run_threads(ctx, o.threads);
  print_counts(g);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "http_gateway: %s\n", e.what());
  return 1;
}
