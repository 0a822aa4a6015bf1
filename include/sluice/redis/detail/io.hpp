// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_IO_HPP
#define SLUICE_REDIS_DETAIL_IO_HPP

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/redis/detail/locator.hpp>
#include <sluice/redis/detail/request.hpp>
#include <sluice/redis/detail/resp.hpp>
#include <sluice/redis/detail/transport.hpp>
#include <sluice/redis/options.hpp>
#include <sluice/redis/reply.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_net.hpp>
#include <sluice/detail/asio_timer.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace sluice::detail {

// The state behind a redis::connection, shared with its pending I/O handlers.
//
// Invariants:
// - pending_ holds the calls in command order (redis_pipeline, request.hpp).
// - gen_ changes whenever the socket is closed; a handler of an older
//   generation only decrements io_ops_ (its socket is gone).
// - io_ops_ counts outstanding socket and timer operations; close() waits for 0.
// - timer_ watches the connect deadline while connecting, else the deadline of
//   pending_'s front (replies come in order: if the oldest call is late, the
//   server is stalled, and the connection is reset).
// - A call is completed exactly once, through a post (erased_handler).
class redis_io : public std::enable_shared_from_this<redis_io> {
 public:
  using socket_type = asio::generic::stream_protocol::socket;
  using endpoint_type = asio::generic::stream_protocol::endpoint;
  enum class state { broken, connecting, open, closed };

  using clock = std::chrono::steady_clock;

  redis_io(asio::any_io_executor ex, std::vector<endpoint_type> endpoints, bool tcp,
           redis::options opts = {})
      : ex_(std::move(ex)),
        transport_(ex_),
        timer_(ex_),
        endpoints_(std::move(endpoints)),
        tcp_(tcp),
        opts_(std::move(opts)) {
    transport_.configure(opts_, tcp_);
  }
  redis_io(const redis_io&) = delete;
  redis_io& operator=(const redis_io&) = delete;

  const asio::any_io_executor& executor() const noexcept { return ex_; }
  const std::vector<endpoint_type>& endpoints() const noexcept { return endpoints_; }
  bool tcp() const noexcept { return tcp_; }
  const redis::options& opts() const noexcept { return opts_; }
  const std::shared_ptr<redis_locator>& locator() const noexcept { return locator_; }

  // Follow `loc` (Sentinel): every connect asks it where to go, and a
  // -READONLY reply (the node was demoted) resets the connection. Once, before use.
  void set_locator(std::shared_ptr<redis_locator> loc) {
    locator_ = std::move(loc);
    locator_->attach(shared_from_this());
  }

  // A new, unconnected state with the same settings (connect_again()).
  std::shared_ptr<redis_io> clone() const {
    auto io = std::make_shared<redis_io>(ex_, endpoints_, tcp_, opts_);
    if (locator_) io->set_locator(locator_);
    return io;
  }

  // The primary moved to `host` (a +switch-master): drops an open socket to
  // anywhere else; the next call locates it.
  void relocate(const std::string& host, const std::string& port) {
    if (state_ == state::open && !(host == host_ && port == port_))
      fail(redis::make_error_code(redis::errc::connection_lost));
  }
  state current() const noexcept { return state_; }
  std::size_t pending() const noexcept { return pending_.size(); }
  // "host:port" where the locator pointed last; empty without a locator.
  std::string node() const { return locator_ ? host_ + ":" + port_ : std::string(); }

  void on_message(std::function<void(const redis::reply&)> f) { on_message_ = std::move(f); }
  void on_lost(std::function<void()> f) { on_lost_ = std::move(f); }

  // Queues one command; the handler gets (error_code, reply).
  template <class Handler>
  void submit(const std::vector<std::string>& args, Handler&& handler) {
    std::string bytes = redis_format(args);
    if (state_ == state::closed) {
      post_completion(std::forward<Handler>(handler), ex_,
                      redis::make_error_code(redis::errc::closed), redis::reply{});
      return;
    }
    auto slot = asio::get_associated_cancellation_slot(handler);
    auto req = std::make_shared<redis_request>();
    req->handler = erased_handler<error_code, redis::reply>(std::forward<Handler>(handler), ex_);
    if (slot.is_connected()) slot.template emplace<redis_canceller<redis_request>>(req, ex_);
    const std::string& name = args.front();
    if (name == "SUBSCRIBE" || name == "PSUBSCRIBE" || name == "subscribe" || name == "psubscribe")
      subscriber_ = true;
    pending_.push_back(bytes, std::move(req));
    if (state_ == state::open) {
      set_deadline(*pending_.calls().back());
      arm_timer();
      start_write();
    } else if (state_ == state::broken) {
      start_connect();
    }
  }

  // Completes with no error once the connection is open, (re)connecting if it
  // is broken; with the connect error, or errc::closed.
  template <class Handler>
  void wait_open(Handler&& handler) {
    if (state_ == state::open || state_ == state::closed) {
      post_completion(
          std::forward<Handler>(handler), ex_,
          state_ == state::open ? error_code{} : redis::make_error_code(redis::errc::closed));
      return;
    }
    open_waiters_.emplace_back(std::forward<Handler>(handler), ex_);
    if (state_ == state::broken) start_connect();
  }

  // Completes once no socket operation is outstanding (after shutdown()).
  template <class Handler>
  void wait_idle(Handler&& handler) {
    if (locator_) {  // then the locator's I/O (once the last of its group closed)
      auto h = std::make_shared<erased_handler<>>(std::forward<Handler>(handler), ex_);
      auto then = [loc = locator_, h] {
        loc->wait_idle([h] { h->complete(); });
      };
      if (io_ops_ == 0) {
        asio::post(ex_, std::move(then));
      } else {
        idle_waiters_.emplace_back(std::move(then), ex_);
      }
      return;
    }
    if (io_ops_ == 0) {
      post_completion(std::forward<Handler>(handler), ex_);
      return;
    }
    idle_waiters_.emplace_back(std::forward<Handler>(handler), ex_);
  }

  // Closes for good: pending and later calls fail with errc::closed.
  void shutdown() {
    if (state_ == state::closed) return;
    state_ = state::closed;
    timer_.cancel();
    on_message_ = nullptr;
    on_lost_ = nullptr;
    fail(redis::make_error_code(redis::errc::closed));
    if (locator_) locator_->detach();
  }

 private:
  void start_connect() {
    state_ = state::connecting;
    ++gen_;
    transport_.close();
    connect_deadline_ = clock::now() + opts_.connect_timeout;
    arm_timer();
    if (locator_) {  // Sentinel: where is the primary now? (within connect_timeout)
      ++io_ops_;
      locator_->locate(
          [self = shared_from_this(), gen = gen_](error_code ec, redis_locator::found f) {
            self->on_located(gen, ec, std::move(f));
          });
      return;
    }
    start_socket();
  }

  void on_located(unsigned gen, error_code ec, redis_locator::found f) {
    --io_ops_;
    if (gen != gen_) return maybe_idle();
    if (ec) return fail(ec);
    endpoints_ = std::move(f.endpoints);
    host_ = std::move(f.host);
    port_ = std::move(f.port);
    start_socket();
  }

  void start_socket() {
    transport_.reset(ex_, opts_, host_);
    reader_.reset();
    ++io_ops_;
    asio::async_connect(transport_.lowest(), endpoints_,
                        [self = shared_from_this(), gen = gen_](
                            error_code ec, const endpoint_type&) { self->on_connect(gen, ec); });
  }

  void on_connect(unsigned gen, error_code ec) {
    --io_ops_;
    if (gen != gen_) return maybe_idle();
    if (ec) return fail(ec);
    if (tcp_) transport_.set_tcp_options(opts_.keepalive);
    if (transport_.tls()) {  // still `connecting`: the connect timeout covers the handshake
      ++io_ops_;
      transport_.async_handshake(
          [self = shared_from_this(), gen](error_code e) { self->on_handshake(gen, e); });
      return;
    }
    on_open();
  }

  void on_handshake(unsigned gen, error_code ec) {
    --io_ops_;
    if (gen != gen_) return maybe_idle();
    if (ec) return fail(ec);  // e.g. "certificate verify failed"
    on_open();
  }

  // The socket is ready for commands: AUTH/SELECT first, then the queue.
  void on_open() {
    state_ = state::open;
    prepend_handshake();
    for (auto& r : pending_.calls()) set_deadline(*r);
    arm_timer();
    auto waiters = std::move(open_waiters_);
    open_waiters_.clear();
    for (auto& w : waiters) w.complete(error_code{});
    start_read();
    start_write();
  }

  void start_read() {
    ++io_ops_;
    auto done = [self = shared_from_this(), gen = gen_](error_code ec, std::size_t n) {
      self->on_read(gen, ec, n);
    };
    transport_.async_read_some(asio::buffer(rbuf_), std::move(done));
  }

  void on_read(unsigned gen, error_code ec, std::size_t n) {
    --io_ops_;
    if (gen != gen_) return maybe_idle();
    if (ec) return fail(redis_transport::lost_because(ec));
    if (!reader_.feed(rbuf_.data(), n))
      return fail(redis::make_error_code(redis::errc::protocol_error));
    for (;;) {
      redis::reply r;
      const int got = reader_.next(r);
      if (got < 0) return fail(redis::make_error_code(redis::errc::protocol_error));
      if (got == 0) break;
      dispatch(std::move(r));
      if (gen != gen_) return maybe_idle();  // a callback shut it down
    }
    start_read();
  }

  void dispatch(redis::reply r) {
    if (subscriber_ && redis_is_push(r)) {
      if (on_message_) on_message_(r);
      return;
    }
    auto req = pending_.pop_front();
    if (!req) return fail(redis::make_error_code(redis::errc::protocol_error));
    if (req->internal && r.is_error())
      return fail(redis::make_error_code(redis::errc::handshake_failed));
    // A primary that was demoted (failover): the next call locates the new one.
    const bool demoted = locator_ && r.is_error() && r.str.rfind("READONLY", 0) == 0;
    if (req->handler) req->handler.complete(error_code{}, std::move(r));
    if (demoted) fail(redis::make_error_code(redis::errc::connection_lost));
  }

  // AUTH and SELECT go first on every new socket, ahead of the calls queued
  // while it was opening; their replies are consumed here.
  void prepend_handshake() {
    auto [bytes, n] = redis_handshake(opts_);
    pending_.push_front_internal(bytes, n);
  }

  void set_deadline(redis_request& r) const {
    if (opts_.command_timeout.count() > 0) r.deadline = clock::now() + opts_.command_timeout;
  }

  // The next moment to check: the connect deadline, or the oldest call's.
  void arm_timer() {
    clock::time_point target;
    if (state_ == state::connecting && opts_.connect_timeout.count() > 0) {
      target = connect_deadline_;
    } else if (state_ == state::open && !pending_.empty() && opts_.command_timeout.count() > 0) {
      target = pending_.calls().front()->deadline;
    } else {
      return;
    }
    if (timer_armed_ && armed_for_ <= target) return;  // it re-checks when it fires
    timer_armed_ = true;
    armed_for_ = target;
    ++io_ops_;
    timer_.expires_at(target);  // cancels an older wait (it only decrements io_ops_)
    timer_.async_wait(
        [self = shared_from_this(), tg = ++timer_gen_](error_code) { self->on_timer(tg); });
  }

  void on_timer(unsigned tg) {
    --io_ops_;
    if (tg != timer_gen_ || state_ == state::closed) return maybe_idle();
    timer_armed_ = false;
    const auto now = clock::now();
    if (state_ == state::connecting && opts_.connect_timeout.count() > 0 &&
        now >= connect_deadline_)
      return fail(redis::make_error_code(redis::errc::timed_out));
    if (state_ == state::open && !pending_.empty() && opts_.command_timeout.count() > 0 &&
        now >= pending_.calls().front()->deadline)
      return fail(redis::make_error_code(redis::errc::timed_out));
    arm_timer();
    maybe_idle();
  }

  void start_write() {
    if (state_ != state::open) return;
    const std::string* bytes = pending_.start_write();
    if (!bytes) return;
    ++io_ops_;
    auto done = [self = shared_from_this(), gen = gen_](error_code ec, std::size_t) {
      self->on_write(gen, ec);
    };
    transport_.async_write(asio::buffer(*bytes), std::move(done));
  }

  void on_write(unsigned gen, error_code ec) {
    --io_ops_;
    pending_.write_done();
    if (gen != gen_) {
      start_write();  // bytes queued for a newer socket
      return maybe_idle();
    }
    if (ec) return fail(redis_transport::lost_because(ec));
    start_write();
  }

  // Drops the socket and fails every call queued or waiting on it.
  void fail(error_code ec) {
    if (state_ != state::closed) state_ = state::broken;
    ++gen_;
    transport_.close();
    subscriber_ = false;
    pending_.fail_all(ec);
    auto waiters = std::move(open_waiters_);
    open_waiters_.clear();
    for (auto& w : waiters) w.complete(ec);
    if (on_lost_) {
      auto f = on_lost_;  // it may replace itself
      f();
    }
    maybe_idle();
  }

  void maybe_idle() {
    if (io_ops_ != 0) return;
    auto waiters = std::move(idle_waiters_);
    idle_waiters_.clear();
    for (auto& w : waiters) w.complete();
  }

  asio::any_io_executor ex_;
  redis_transport transport_;  // this generation's stream (TLS or plain)
  asio::steady_timer timer_;
  std::vector<endpoint_type> endpoints_;
  bool tcp_;
  redis::options opts_;
  std::string host_ = opts_.host;           // for TLS; where the locator pointed
  std::string port_;                        // the locator's port ("" without one)
  std::shared_ptr<redis_locator> locator_;  // Sentinel; null for a fixed address
  clock::time_point connect_deadline_{};
  clock::time_point armed_for_{};
  bool timer_armed_ = false;
  unsigned timer_gen_ = 0;
  state state_ = state::broken;
  unsigned gen_ = 0;
  std::size_t io_ops_ = 0;
  bool subscriber_ = false;
  redis_pipeline pending_;  // the calls in command order, the bytes to write
  redis_resp_reader reader_;
  std::array<char, 16384> rbuf_{};
  std::function<void(const redis::reply&)> on_message_;
  std::function<void()> on_lost_;
  std::vector<erased_handler<error_code>> open_waiters_;
  std::vector<erased_handler<>> idle_waiters_;
};

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_IO_HPP
