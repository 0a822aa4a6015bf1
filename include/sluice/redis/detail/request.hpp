// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_REQUEST_HPP
#define SLUICE_REDIS_DETAIL_REQUEST_HPP

// One call waiting for its reply on a redis_io, the pipeline of them in
// command order, and the hook a call's cancellation slot holds (redis_io's
// and redis_cluster's calls alike).

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/redis/reply.hpp>

#include <sluice/detail/asio.hpp>

#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <utility>

namespace sluice::detail {

// One call waiting for its reply. The handler is empty once it has completed
// (a cancelled call stays queued: its reply is still read and dropped).
struct redis_request {
  erased_handler<error_code, redis::reply> handler;
  std::chrono::steady_clock::time_point deadline{};  // command_timeout; set once sent
  bool internal = false;  // AUTH/SELECT of the handshake: an error reply drops the connection
};

// A connection's calls in command order, with the bytes not yet written.
// Invariant: calls() holds, in order, every call whose command bytes are in
// the write being done, in the bytes queued behind it, or already sent and not
// yet answered; the n-th reply read belongs to front() (RESP replies come in
// command order). One write at a time.
class redis_pipeline {
 public:
  using call_ptr = std::shared_ptr<redis_request>;

  const std::deque<call_ptr>& calls() const noexcept { return calls_; }
  bool empty() const noexcept { return calls_.empty(); }
  std::size_t size() const noexcept { return calls_.size(); }

  // Queues `req` behind every call, its command bytes behind theirs.
  void push_back(const std::string& bytes, call_ptr req) {
    out_ += bytes;
    calls_.push_back(std::move(req));
  }

  // Queues `n` internal calls (AUTH, SELECT) ahead of every call, their bytes
  // ahead of the unwritten ones (on a new socket: nothing was written yet).
  void push_front_internal(const std::string& bytes, std::size_t n) {
    out_.insert(0, bytes);
    for (std::size_t i = 0; i < n; ++i) {
      auto req = std::make_shared<redis_request>();
      req->internal = true;
      calls_.push_front(std::move(req));
    }
  }

  // The call the next reply belongs to; null if none is waiting.
  call_ptr pop_front() {
    if (calls_.empty()) return nullptr;
    auto req = std::move(calls_.front());
    calls_.pop_front();
    return req;
  }

  // The bytes to write next, moved into the write buffer; null if a write is
  // under way or nothing is queued. The buffer stays valid until write_done().
  const std::string* start_write() {
    if (writing_active_ || out_.empty()) return nullptr;
    writing_.swap(out_);
    out_.clear();
    writing_active_ = true;
    return &writing_;
  }
  void write_done() {
    writing_active_ = false;
    writing_.clear();
  }

  // The socket is gone: drops the unwritten bytes and fails every call.
  void fail_all(error_code ec) {
    out_.clear();
    auto calls = std::move(calls_);
    calls_.clear();
    for (auto& r : calls)
      if (r->handler) r->handler.complete(ec, redis::reply{});
  }

 private:
  std::deque<call_ptr> calls_;
  std::string out_;      // queued, not yet written
  std::string writing_;  // the write under way
  bool writing_active_ = false;
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
