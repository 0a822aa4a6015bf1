// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_REQUEST_HPP
#define SLUICE_REDIS_DETAIL_REQUEST_HPP

// One call waiting for its reply on a redis_io, and the hook a call's
// cancellation slot holds (redis_io's and redis_cluster's calls alike).

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/redis/reply.hpp>

#include <sluice/detail/asio.hpp>

#include <chrono>
#include <memory>
#include <utility>

namespace sluice::detail {

// One call waiting for its reply. The handler is empty once it has completed
// (a cancelled call stays queued: its reply is still read and dropped).
struct redis_request {
  erased_handler<error_code, redis::reply> handler;
  std::chrono::steady_clock::time_point deadline{};  // command_timeout; set once sent
  bool internal = false;  // AUTH/SELECT of the handshake: an error reply drops the connection
};

// Installed in a call's cancellation slot: completes the call with
// operation_aborted from a post (it may not clear the slot it runs from).
// The call stays queued, so its reply is still consumed in order (a cluster
// command goes on: its reply, or the replies of its re-sends, are read and
// dropped). `Call` has an erased_handler<error_code, redis::reply> `handler`.
template <class Call>
struct redis_canceller {
  redis_canceller(std::shared_ptr<Call> c, asio::any_io_executor e)
      : call(std::move(c)), ex(std::move(e)) {}
  std::shared_ptr<Call> call;
  asio::any_io_executor ex;
  void operator()(asio::cancellation_type_t type) const {
    if ((type & (asio::cancellation_type::terminal | asio::cancellation_type::partial |
                 asio::cancellation_type::total)) == asio::cancellation_type::none)
      return;
    asio::post(ex, [c = call] {
      if (c->handler) c->handler.complete(asio::error::operation_aborted, redis::reply{});
    });
  }
};

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_REQUEST_HPP
