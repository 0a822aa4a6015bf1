// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_IO_HPP
#define SLUICE_REDIS_DETAIL_IO_HPP

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/redis/detail/locator.hpp>
#include <sluice/redis/detail/resp.hpp>
#include <sluice/redis/detail/tls.hpp>
#include <sluice/redis/options.hpp>
#include <sluice/redis/reply.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_net.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace sluice::detail {

// One call waiting for its reply. The handler is empty once it has completed
// (a cancelled call stays queued: its reply is still read and dropped).
struct redis_request {
  erased_handler<error_code, redis::reply> handler;
  std::chrono::steady_clock::time_point deadline{};  // command_timeout; set once sent
  bool internal = false;  // AUTH/SELECT of the handshake: an error reply drops the connection
};

// The state behind a redis::connection, shared with its pending I/O handlers.
//
// Invariants:
// - pending_ holds, in order, every call whose command bytes are in writing_,
//   in out_, or already sent and not yet answered; the n-th reply read belongs
//   to pending_.front() (RESP replies come in command order).
// - gen_ changes whenever the socket is closed; a handler of an older
//   generation only decrements io_ops_ (its socket is gone).
// - io_ops_ counts outstanding socket and timer operations; close() waits for 0.
// - timer_ watches the connect deadline while connecting, else the deadline of
//   pending_.front() (replies come in order: if the oldest call is late, the
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
        socket_(ex_),
        timer_(ex_),
        endpoints_(std::move(endpoints)),
        tcp_(tcp),
        opts_(std::move(opts)) {
    if (opts_.tls) {
#if defined(SLUICE_REDIS_TLS)
      if (!tcp_)
        throw std::invalid_argument("sluice::redis: options::tls needs TCP, not a Unix socket");
      tls_ctx_ = redis_tls_context(*opts_.tls);
#else
      throw std::invalid_argument(
          "sluice::redis: options::tls needs TLS support: define SLUICE_REDIS_TLS in every "
          "translation unit and link OpenSSL (CMake: link sluice::redis_tls instead of "
          "sluice::redis)");
#endif
    }
  }
  redis_io(const redis_io&) = delete;
  redis_io& operator=(const redis_io&) = delete;

  const asio::any_io_executor& executor() const noexcept {
    return ex_;
  }
  const std::vector<endpoint_type>& endpoints() const noexcept {
    return endpoints_;
  }
  bool tcp() const noexcept {
    return tcp_;
  }
  const redis::options& opts() const noexcept {
    return opts_;
  }
  const std::shared_ptr<redis_locator>& locator() const noexcept {
    return locator_;
  }

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
  state current() const noexcept {
    return state_;
  }
  std::size_t pending() const noexcept {
    return pending_.size();
  }
  // "host:port" where the locator pointed last; empty without a locator.
  std::string node() const {
    return locator_ ? host_ + ":" + port_ : std::string();
  }

  void on_message(std::function<void(const redis::reply&)> f) {
    on_message_ = std::move(f);
  }
  void on_lost(std::function<void()> f) {
    on_lost_ = std::move(f);
  }

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
    if (slot.is_connected()) slot.template emplace<canceller>(req, ex_);
    const std::string& name = args.front();
    if (name == "SUBSCRIBE" || name == "PSUBSCRIBE" || name == "subscribe" || name == "psubscribe")
      subscriber_ = true;
    out_ += bytes;
    pending_.push_back(std::move(req));
    if (state_ == state::open) {
      set_deadline(*pending_.back());
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
  // Installed in a call's cancellation slot: completes the call with
  // operation_aborted from a post (it may not clear the slot it runs from).
  // The request stays queued, so its reply is still consumed in order.
  struct canceller {
    canceller(std::shared_ptr<redis_request> r, asio::any_io_executor e)
        : req(std::move(r)), ex(std::move(e)) {}
    std::shared_ptr<redis_request> req;
    asio::any_io_executor ex;
    void operator()(asio::cancellation_type_t type) const {
      if ((type & (asio::cancellation_type::terminal | asio::cancellation_type::partial |
                   asio::cancellation_type::total)) == asio::cancellation_type::none)
        return;
      asio::post(ex, [r = req] {
        if (r->handler) r->handler.complete(asio::error::operation_aborted, redis::reply{});
      });
    }
  };

  void start_connect() {
    state_ = state::connecting;
    ++gen_;
    error_code ignored;
    lowest().close(ignored);
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
    socket_ = socket_type(ex_);
#if defined(SLUICE_REDIS_TLS)
    tls_.reset();  // its last operations keep it alive until they end
    if (tls_ctx_) tls_ = redis_tls_open(ex_, *tls_ctx_, *opts_.tls, host_);
#endif
    reader_.reset();
    ++io_ops_;
    asio::async_connect(lowest(), endpoints_,
                        [self = shared_from_this(), gen = gen_](
                            error_code ec, const endpoint_type&) { self->on_connect(gen, ec); });
  }

  void on_connect(unsigned gen, error_code ec) {
    --io_ops_;
    if (gen != gen_) return maybe_idle();
    if (ec) return fail(ec);
    if (tcp_) set_tcp_options();
#if defined(SLUICE_REDIS_TLS)
    if (tls_) {  // still `connecting`: the connect timeout covers the handshake
      ++io_ops_;
      tls_->async_handshake(asio::ssl::stream_base::client,
                            [self = shared_from_this(), gen, keep = tls_](error_code e) {
                              self->on_handshake(gen, e);
                            });
      return;
    }
#endif
    on_open();
  }

#if defined(SLUICE_REDIS_TLS)
  void on_handshake(unsigned gen, error_code ec) {
    --io_ops_;
    if (gen != gen_) return maybe_idle();
    if (ec) return fail(ec);  // e.g. "certificate verify failed"
    on_open();
  }
#endif

  // The socket is ready for commands: AUTH/SELECT first, then the queue.
  void on_open() {
    state_ = state::open;
    prepend_handshake();
    for (auto& r : pending_) set_deadline(*r);
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
#if defined(SLUICE_REDIS_TLS)
    if (tls_) {
      tls_->async_read_some(
          asio::buffer(rbuf_),
          [done = std::move(done), keep = tls_](error_code ec, std::size_t n) { done(ec, n); });
      return;
    }
#endif
    socket_.async_read_some(asio::buffer(rbuf_), std::move(done));
  }

  void on_read(unsigned gen, error_code ec, std::size_t n) {
    --io_ops_;
    if (gen != gen_) return maybe_idle();
    if (ec) return fail(lost_because(ec));
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
    if (pending_.empty()) return fail(redis::make_error_code(redis::errc::protocol_error));
    auto req = std::move(pending_.front());
    pending_.pop_front();
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
    out_.insert(0, bytes);
    for (std::size_t i = 0; i < n; ++i) {
      auto req = std::make_shared<redis_request>();
      req->internal = true;
      pending_.push_front(std::move(req));
    }
  }

  // The socket of this generation (inside the TLS stream when there is one).
  socket_type& lowest() noexcept {
#if defined(SLUICE_REDIS_TLS)
    if (tls_) return tls_->next_layer();
#endif
    return socket_;
  }

  void set_tcp_options() {
    error_code ec;
    socket_type& s = lowest();
    s.set_option(asio::ip::tcp::no_delay(true), ec);
    if (!opts_.keepalive) return;
    s.set_option(asio::socket_base::keep_alive(true), ec);
    s.set_option(asio::detail::socket_option::integer<IPPROTO_TCP, TCP_KEEPIDLE>(15), ec);
    s.set_option(asio::detail::socket_option::integer<IPPROTO_TCP, TCP_KEEPINTVL>(5), ec);
    s.set_option(asio::detail::socket_option::integer<IPPROTO_TCP, TCP_KEEPCNT>(3), ec);
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
      target = pending_.front()->deadline;
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
        now >= pending_.front()->deadline)
      return fail(redis::make_error_code(redis::errc::timed_out));
    arm_timer();
    maybe_idle();
  }

  void start_write() {
    if (write_active_ || out_.empty() || state_ != state::open) return;
    writing_.swap(out_);
    out_.clear();
    write_active_ = true;
    ++io_ops_;
    auto done = [self = shared_from_this(), gen = gen_](error_code ec, std::size_t) {
      self->on_write(gen, ec);
    };
#if defined(SLUICE_REDIS_TLS)
    if (tls_) {
      asio::async_write(
          *tls_, asio::buffer(writing_),
          [done = std::move(done), keep = tls_](error_code ec, std::size_t n) { done(ec, n); });
      return;
    }
#endif
    asio::async_write(socket_, asio::buffer(writing_), std::move(done));
  }

  void on_write(unsigned gen, error_code ec) {
    --io_ops_;
    write_active_ = false;
    writing_.clear();
    if (gen != gen_) {
      start_write();  // bytes queued for a newer socket
      return maybe_idle();
    }
    if (ec) return fail(lost_because(ec));
    start_write();
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

  // Drops the socket and fails every call queued or waiting on it.
  void fail(error_code ec) {
    if (state_ != state::closed) state_ = state::broken;
    ++gen_;
    error_code ignored;
    lowest().close(ignored);
    out_.clear();
    subscriber_ = false;
    auto pending = std::move(pending_);
    pending_.clear();
    for (auto& r : pending)
      if (r->handler) r->handler.complete(ec, redis::reply{});
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
  socket_type socket_;
  asio::steady_timer timer_;
  std::vector<endpoint_type> endpoints_;
  bool tcp_;
  redis::options opts_;
  std::string host_ = opts_.host;           // for TLS; where the locator pointed
  std::string port_;                        // the locator's port ("" without one)
  std::shared_ptr<redis_locator> locator_;  // Sentinel; null for a fixed address
#if defined(SLUICE_REDIS_TLS)
  std::shared_ptr<asio::ssl::context> tls_ctx_;  // options::tls, loaded once
  std::shared_ptr<redis_tls_stream> tls_;        // this generation's; owns its socket
#endif
  clock::time_point connect_deadline_{};
  clock::time_point armed_for_{};
  bool timer_armed_ = false;
  unsigned timer_gen_ = 0;
  state state_ = state::broken;
  unsigned gen_ = 0;
  std::size_t io_ops_ = 0;
  bool write_active_ = false;
  bool subscriber_ = false;
  std::string out_;
  std::string writing_;
  std::deque<std::shared_ptr<redis_request>> pending_;
  redis_resp_reader reader_;
  std::array<char, 16384> rbuf_{};
  std::function<void(const redis::reply&)> on_message_;
  std::function<void()> on_lost_;
  std::vector<erased_handler<error_code>> open_waiters_;
  std::vector<erased_handler<>> idle_waiters_;
};

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_IO_HPP
