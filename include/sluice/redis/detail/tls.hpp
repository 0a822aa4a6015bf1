// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_TLS_HPP
#define SLUICE_REDIS_DETAIL_TLS_HPP

// TLS for redis_io (options::tls), through asio::ssl. Compiled only with
// SLUICE_REDIS_TLS (the sluice::redis_tls CMake target, which links OpenSSL);
// without it this header is empty, and redis_io refuses options::tls.

#include <sluice/config.hpp>
#include <sluice/redis/options.hpp>

#if defined(SLUICE_REDIS_TLS)

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_net.hpp>

#if defined(SLUICE_USE_BOOST_ASIO)
#include <boost/asio/ssl.hpp>
#else
#include <asio/ssl.hpp>
#endif

#include <openssl/ssl.h>

#include <memory>
#include <string>

namespace sluice::detail {

using redis_tls_stream = asio::ssl::stream<asio::generic::stream_protocol::socket>;

// The client context of one connection (shared by its sockets): TLS 1.2 or
// newer, the CA to verify the server with, the client's certificate. Throws
// std::invalid_argument naming the file that could not be loaded.
inline std::shared_ptr<asio::ssl::context> redis_tls_context(const redis::tls_options& t) {
  auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
  auto load = [](const char* what, const std::string& file, auto&& f) {
    error_code ec;
    f(ec);
    if (ec)
      throw std::invalid_argument("sluice::redis: tls_options::" + std::string(what) + " \"" +
                                  file + "\": " + ec.message());
  };
  ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                   asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                   asio::ssl::context::no_tlsv1_1);
  if (t.verify) {
    ctx->set_verify_mode(asio::ssl::verify_peer);
    if (t.ca_file.empty()) {
      load("ca_file", "(system default)",
           [&](error_code& ec) { ctx->set_default_verify_paths(ec); });
    } else {
      load("ca_file", t.ca_file, [&](error_code& ec) { ctx->load_verify_file(t.ca_file, ec); });
    }
  } else {
    ctx->set_verify_mode(asio::ssl::verify_none);
  }
  if (!t.cert_file.empty()) {
    load("cert_file", t.cert_file,
         [&](error_code& ec) { ctx->use_certificate_chain_file(t.cert_file, ec); });
    const std::string& key = t.key_file.empty() ? t.cert_file : t.key_file;
    load("key_file", key,
         [&](error_code& ec) { ctx->use_private_key_file(key, asio::ssl::context::pem, ec); });
  }
  return ctx;
}

// A stream for one socket: SNI (for a DNS name only, RFC 6066) and the name
// the certificate must carry. `host`: the address connected to.
inline std::shared_ptr<redis_tls_stream> redis_tls_open(const asio::any_io_executor& ex,
                                                        asio::ssl::context& ctx,
                                                        const redis::tls_options& t,
                                                        const std::string& host) {
  auto s = std::make_shared<redis_tls_stream>(ex, ctx);
  const std::string& name = t.server_name.empty() ? host : t.server_name;
  error_code not_ip;
  (void)asio::ip::make_address(name, not_ip);
  if (!name.empty() && not_ip) SSL_set_tlsext_host_name(s->native_handle(), name.c_str());
  if (t.verify && !name.empty()) s->set_verify_callback(asio::ssl::host_name_verification(name));
  return s;
}

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_TLS

#endif  // SLUICE_REDIS_DETAIL_TLS_HPP
