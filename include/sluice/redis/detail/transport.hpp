// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_TRANSPORT_HPP
#define SLUICE_REDIS_DETAIL_TRANSPORT_HPP

// The byte stream under a redis_io: a plain socket, or a TLS stream over it
// (options::tls), with its TCP options and what a failed read or write reports.
// redis_io keeps the connection's state; this room only opens, reads, writes
// and closes one generation's stream.

#include <sluice/config.hpp>
#include <sluice/redis/detail/tls.hpp>
#include <sluice/redis/options.hpp>
#include <sluice/redis/reply.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_net.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

namespace sluice::detail {

// One connection's stream. Every asynchronous operation on the TLS stream
// keeps it alive until its handler runs (a new generation replaces it).
class redis_transport {
 public:
  using socket_type = asio::generic::stream_protocol::socket;

  explicit redis_transport(const asio::any_io_executor& ex) : socket_(ex) {}

  // Loads options::tls once. Throws std::invalid_argument for TLS over a Unix
  // socket, or without SLUICE_REDIS_TLS.
  void configure(const redis::options& opts, bool tcp) {
    if (opts.tls) {
#if defined(SLUICE_REDIS_TLS)
      if (!tcp)
        throw std::invalid_argument("sluice::redis: options::tls needs TCP, not a Unix socket");
      tls_ctx_ = redis_tls_context(*opts.tls);
#else
      (void)tcp;
      throw std::invalid_argument(
          "sluice::redis: options::tls needs TLS support: define SLUICE_REDIS_TLS in every "
          "translation unit and link OpenSSL (CMake: link sluice::redis_tls instead of "
          "sluice::redis)");
#endif
    }
  }

  // A new, unopened stream for one connection attempt to `host` (TLS's SNI
  // and verification name).
  void reset(const asio::any_io_executor& ex, const redis::options& opts, const std::string& host) {
    socket_ = socket_type(ex);
#if defined(SLUICE_REDIS_TLS)
    tls_.reset();  // its last operations keep it alive until they end
    if (tls_ctx_) tls_ = redis_tls_open(ex, *tls_ctx_, *opts.tls, host);
#else
    (void)opts;
    (void)host;
#endif
  }

  // The socket of this generation (inside the TLS stream when there is one).
  socket_type& lowest() noexcept {
#if defined(SLUICE_REDIS_TLS)
    if (tls_) return tls_->next_layer();
#endif
    return socket_;
  }

  void close() {
    error_code ignored;
    lowest().close(ignored);
  }

  // Whether the stream needs a TLS handshake once the socket is connected.
  bool tls() const noexcept {
#if defined(SLUICE_REDIS_TLS)
    return tls_ != nullptr;
#else
    return false;
#endif
  }

  // The client handshake; only when tls(). The handler gets (error_code).
  template <class Handler>
  void async_handshake(Handler&& handler) {
#if defined(SLUICE_REDIS_TLS)
    tls_->async_handshake(
        asio::ssl::stream_base::client,
        [h = std::forward<Handler>(handler), keep = tls_](error_code e) mutable { h(e); });
#else
    (void)handler;  // no TLS stream: tls() is false
#endif
  }

  // The handler gets (error_code, bytes read).
  template <class Handler>
  void async_read_some(asio::mutable_buffer buf, Handler&& handler) {
#if defined(SLUICE_REDIS_TLS)
    if (tls_) {
      tls_->async_read_some(buf, [done = std::forward<Handler>(handler), keep = tls_](
                                     error_code ec, std::size_t n) mutable { done(ec, n); });
      return;
    }
#endif
    socket_.async_read_some(buf, std::forward<Handler>(handler));
  }

  // Writes all of `buf`; the handler gets (error_code, bytes written).
  template <class Handler>
  void async_write(asio::const_buffer buf, Handler&& handler) {
#if defined(SLUICE_REDIS_TLS)
    if (tls_) {
      asio::async_write(*tls_, buf,
                        [done = std::forward<Handler>(handler), keep = tls_](
                            error_code ec, std::size_t n) mutable { done(ec, n); });
      return;
    }
#endif
    asio::async_write(socket_, buf, std::forward<Handler>(handler));
  }

  // No delay; with `keepalive`, probes after 15 s idle, every 5 s, 3 times.
  void set_tcp_options(bool keepalive) {
    error_code ec;
    socket_type& s = lowest();
    s.set_option(asio::ip::tcp::no_delay(true), ec);
    if (!keepalive) return;
    s.set_option(asio::socket_base::keep_alive(true), ec);
    s.set_option(asio::detail::socket_option::integer<IPPROTO_TCP, TCP_KEEPIDLE>(15), ec);
    s.set_option(asio::detail::socket_option::integer<IPPROTO_TCP, TCP_KEEPINTVL>(5), ec);
    s.set_option(asio::detail::socket_option::integer<IPPROTO_TCP, TCP_KEEPCNT>(3), ec);
  }

  // What a failed read or write reports: what TLS said (a server that
  // rejects the client's certificate sends its alert with the first reply),
  // else errc::connection_lost.
  static error_code lost_because(error_code ec) {
#if defined(SLUICE_REDIS_TLS)
    if (ec.category() == asio::error::get_ssl_category()) return ec;
#endif
    (void)ec;
    return redis::make_error_code(redis::errc::connection_lost);
  }

 private:
  socket_type socket_;
#if defined(SLUICE_REDIS_TLS)
  std::shared_ptr<asio::ssl::context> tls_ctx_;  // options::tls, loaded once
  std::shared_ptr<redis_tls_stream> tls_;        // this generation's; owns its socket
#endif
};

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_TRANSPORT_HPP
