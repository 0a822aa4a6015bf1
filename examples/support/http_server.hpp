// SPDX-License-Identifier: BSL-1.0
// A small HTTP/1.1 server (Boost.Beast) in the usual shape of an Asio
// service, shared by examples/http_gateway.cpp and examples/metrics_endpoint.cpp:
// it accepts on 127.0.0.1 and runs each connection's session on a strand of
// its own of the io_context, so the io_context may be run by any number of
// threads; keep-alive requests of a connection are answered one after
// another by the handler. stop() is the graceful stop (also on SIGINT/SIGTERM
// after stop_on_signals()): it closes the acceptor and every connection; a
// request already in the handler runs to its end (its answer is then dropped),
// and the io_context runs out of work, so run(threads) returns.
// It ships beside the examples and includes installed headers only.
#ifndef SLUICE_EXAMPLES_SUPPORT_HTTP_SERVER_HPP
#define SLUICE_EXAMPLES_SUPPORT_HTTP_SERVER_HPP

#ifndef SLUICE_USE_BOOST_ASIO
#error "support/http_server.hpp uses Boost.Beast: build with SLUICE_USE_BOOST_ASIO"
#endif

#include <sluice/asio.hpp>

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace sluice_examples {

namespace http = boost::beast::http;
using http_request = http::request<http::string_body>;
using http_response = http::response<http::string_body>;

/// Answers one request; runs on the connection's strand. The request lives
/// until the answer is written. Version, keep-alive, Content-Length and (if
/// unset) `Content-Type: text/plain` are set by the server.
using http_handler = std::function<asio::awaitable<http_response>(const http_request&)>;

class http_server {
  using tcp = asio::ip::tcp;

 public:
  /// Listens on 127.0.0.1:`port` (0: a free port) of `ctx`; start() accepts.
  http_server(asio::io_context& ctx, unsigned short port, http_handler handler)
      : ctx_(ctx),
        handler_(std::move(handler)),
        strand_(asio::make_strand(ctx)),
        acceptor_(strand_, tcp::endpoint(asio::ip::address_v4::loopback(), port)),
        signals_(strand_) {}

  [[nodiscard]] unsigned short port() const { return acceptor_.local_endpoint().port(); }

  /// On the first SIGINT or SIGTERM: stop(), then `then()` (on the server's strand).
  void stop_on_signals(std::function<void()> then = [] {}) {
    signals_.add(SIGINT);
    signals_.add(SIGTERM);
    signals_.async_wait([this, then = std::move(then)](sluice::error_code ec, int) {
      if (ec) return;  // stop() cancelled the wait
      stop();
      then();
    });
  }

  /// Accepts, and runs the io_context on `threads` threads, this one
  /// included, until it runs out of work (after stop(), when every session
  /// has ended).
  void run(long threads) {
    asio::co_spawn(strand_, listen(), asio::detached);
    std::vector<std::jthread> pool(static_cast<std::size_t>(std::max(threads, 1L) - 1));
    for (auto& t : pool) t = std::jthread([this] { ctx_.run(); });
    ctx_.run();
  }

  /// The graceful stop, from any thread (see the file's comment).
  void stop() {
    asio::post(strand_, [this] {
      sluice::error_code ec;
      acceptor_.close(ec);
      signals_.cancel(ec);
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
  using stream_ptr = std::shared_ptr<boost::beast::tcp_stream>;

  asio::awaitable<void> listen() {
    for (;;) {
      sluice::error_code ec;
      tcp::socket socket = co_await acceptor_.async_accept(
          asio::make_strand(ctx_), asio::redirect_error(asio::use_awaitable, ec));
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
      if (ec) continue;  // e.g. out of descriptors: drop this one, keep serving
      auto stream = std::make_shared<boost::beast::tcp_stream>(std::move(socket));
      {
        std::lock_guard<std::mutex> lock(mu_);
        std::erase_if(open_, [](const auto& w) { return w.expired(); });
        open_.push_back(stream);
      }
      asio::co_spawn(stream->get_executor(), session(stream), asio::detached);
    }
  }

  asio::awaitable<void> session(stream_ptr stream) {
    boost::beast::flat_buffer buffer;
    for (;;) {
      http_request req;
      sluice::error_code ec;
      stream->expires_after(std::chrono::seconds(30));
      co_await http::async_read(*stream, buffer, req,
                                asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
      stream->expires_never();
      http_response res = co_await handler_(req);
      res.version(req.version());
      if (res.find(http::field::content_type) == res.end())
        res.set(http::field::content_type, "text/plain");
      res.keep_alive(req.keep_alive());
      res.prepare_payload();
      co_await http::async_write(*stream, res, asio::redirect_error(asio::use_awaitable, ec));
      if (ec || !res.keep_alive()) break;
    }
    sluice::error_code ec;
    stream->socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  asio::io_context& ctx_;
  http_handler handler_;
  asio::strand<asio::io_context::executor_type> strand_;
  tcp::acceptor acceptor_;
  asio::signal_set signals_;
  std::mutex mu_;
  std::vector<std::weak_ptr<boost::beast::tcp_stream>> open_;
};

}  // namespace sluice_examples

#endif  // SLUICE_EXAMPLES_SUPPORT_HTTP_SERVER_HPP
