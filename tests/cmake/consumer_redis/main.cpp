// SPDX-License-Identifier: BSL-1.0
// Compiles the Redis headers and links hiredis through sluice::redis: formats
// a command with hiredis and checks a connection to a closed port fails.
#include <sluice/redis/rate_limiter.hpp>
#include <sluice/redis/semaphore.hpp>

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
  return failed ? 0 : 1;
}
