// SPDX-License-Identifier: BSL-1.0
// Compiles the Redis headers and links hiredis through sluice::redis: formats
// a command with hiredis and checks a connection to a closed port fails.
// Built twice: through sluice::redis (no OpenSSL: options::tls is refused
// with std::invalid_argument) and, as consumer_tls, through sluice::redis_tls
// (TLS compiled in: the handshake is tried, and fails on the closed port).
#include <sluice/redis/rate_limiter.hpp>
#include <sluice/redis/semaphore.hpp>

#include <exception>
#include <memory>
#include <stdexcept>
#include <string>

int main() {
  const std::string ping = sluice::detail::redis_format({"PING"});
  if (ping != "*1\r\n$4\r\nPING\r\n") return 1;
  sluice::asio::io_context ctx;
  bool failed = false;
  sluice::asio::co_spawn(ctx, sluice::redis::connect(ctx.get_executor(), "127.0.0.1", 1),
                         [&](std::exception_ptr e, std::shared_ptr<sluice::redis::connection>) {
                           failed = e != nullptr;
                         });
  ctx.run();
  if (!failed) return 1;
  sluice::redis::options o;
  o.port = 1;
  o.tls.emplace();
  o.tls->verify = false;
  std::exception_ptr tls_error;
  sluice::asio::co_spawn(ctx, sluice::redis::connect(ctx.get_executor(), o),
                         [&](std::exception_ptr e, std::shared_ptr<sluice::redis::connection>) {
                           tls_error = e;
                         });
  ctx.restart();
  ctx.run();
  try {
    if (tls_error) std::rethrow_exception(tls_error);
  } catch (const std::invalid_argument&) {
#if defined(SLUICE_REDIS_TLS)
    return 1;  // TLS is compiled in: it must not be refused
#else
    return 0;
#endif
  } catch (const sluice::system_error&) {
#if defined(SLUICE_REDIS_TLS)
    return 0;  // connection refused: TLS was set up, the port is closed
#endif
  }
  return 1;
}
