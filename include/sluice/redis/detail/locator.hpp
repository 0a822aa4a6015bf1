// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_LOCATOR_HPP
#define SLUICE_REDIS_DETAIL_LOCATOR_HPP

// The interface through which a connection finds the node it talks to
// (Sentinel's primary); detail/io.hpp asks it, sentinel.hpp implements it.

#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_net.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sluice::detail {

class redis_io;

// Where a connection that follows a primary (Sentinel) connects: asked
// before every connect; shared by a connection and those opened from it with
// connect_again(), which attach() on creation and detach() on shutdown. It
// owns the I/O it needs (sentinel queries, the +switch-master watcher) and
// ends it once every connection of the group has detached.
class redis_locator {
 public:
  using endpoint_type = asio::generic::stream_protocol::endpoint;
  // What locate() found: where to connect; its host (as the sentinels name
  // it: TLS checks the certificate against it unless tls_options says) and port.
  struct found {
    std::vector<endpoint_type> endpoints;
    std::string host, port;
  };
  virtual ~redis_locator() = default;
  // Completes `done` later (never inline) with the current primary.
  virtual void locate(std::function<void(error_code, found)> done) = 0;
  virtual void attach(const std::shared_ptr<redis_io>& io) = 0;
  virtual void detach() = 0;
  // Calls `done` (later, never inline) once the locator's own I/O has ended.
  virtual void wait_idle(std::function<void()> done) = 0;
  // The local send time of the last check in which the sentinels' majority
  // named `node` ("host:port") primary; time_point::min() if none did.
  virtual std::chrono::steady_clock::time_point confirmed_at(const std::string& node) const = 0;
};

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_LOCATOR_HPP
