// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_REDIS_IO_HPP
#define SLUICE_DETAIL_REDIS_IO_HPP

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/redis/reply.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_net.hpp>

#include <hiredis/hiredis.h>

#include <array>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace sluice::detail {

// One command in RESP, formatted by hiredis. Throws std::invalid_argument for
// an empty command.
inline std::string redis_format(const std::vector<std::string>& args) {
  if (args.empty()) throw std::invalid_argument("sluice::redis: a command needs at least its name");
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  char* out = nullptr;
  const int n =
      redisFormatCommandArgv(&out, static_cast<int>(args.size()), argv.data(), lens.data());
  if (n < 0 || out == nullptr) throw std::bad_alloc();
  std::string s(out, static_cast<std::size_t>(n));
  redisFreeCommand(out);
  return s;
}

// Copies hiredis's reply tree into a redis::reply.
inline redis::reply redis_convert(const redisReply* r) {
  redis::reply out;
  switch (r->type) {
    case REDIS_REPLY_NIL:
      out.kind = redis::reply_kind::nil;
      break;
    case REDIS_REPLY_INTEGER:
      out.kind = redis::reply_kind::integer;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.kind = redis::reply_kind::array;
      out.elements.reserve(r->elements);
      for (std::size_t i = 0; i < r->elements; ++i)
        out.elements.push_back(redis_convert(r->element[i]));
      break;
    case REDIS_REPLY_STATUS:
      out.kind = redis::reply_kind::status;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.kind = redis::reply_kind::error;
      out.str.assign(r->str, r->len);
      break;
    default:  // string, and RESP3 kinds of newer hiredis
      out.kind = redis::reply_kind::string;
      if (r->str != nullptr) out.str.assign(r->str, r->len);
      break;
  }
  return out;
}

// A pub/sub message ("message"/"pmessage" array) on a subscribed connection.
inline bool redis_is_push(const redis::reply& r) {
  return r.kind == redis::reply_kind::array && r.elements.size() >= 3 &&
         (r.elements[0].str == "message" || r.elements[0].str == "pmessage");
}

// One call waiting for its reply. The handler is empty once it has completed
// (a cancelled call stays queued: its reply is still read and dropped).
struct redis_request {
  erased_handler<error_code, redis::reply> handler;
};

// The state behind a redis::connection, shared with its pending I/O handlers.
//
// Invariants:
// - pending_ holds, in order, every call whose command bytes are in writing_,
//   in out_, or already sent and not yet answered; the n-th reply read belongs
//   to pending_.front() (RESP replies come in command order).
// - gen_ changes whenever the socket is closed; a handler of an older
//   generation only decrements io_ops_ (its socket is gone).
// - io_ops_ counts outstanding socket operations; close() waits for 0.
// - A call is completed exactly once, through a post (erased_handler).
class redis_io : public std::enable_shared_from_this<redis_io> {
 public:
  using socket_type = asio::generic::stream_protocol::socket;
  using endpoint_type = asio::generic::stream_protocol::endpoint;
  enum class state { broken, connecting, open, closed };

  redis_io(asio::any_io_executor ex, std::vector<endpoint_type> endpoints, bool tcp)
      : ex_(std::move(ex)), socket_(ex_), endpoints_(std::move(endpoints)), tcp_(tcp) {}
  redis_io(const redis_io&) = delete;
  redis_io& operator=(const redis_io&) = delete;
  ~redis_io() {
    if (reader_ != nullptr) redisReaderFree(reader_);
  }

  const asio::any_io_executor& executor() const noexcept { return ex_; }
  const std::vector<endpoint_type>& endpoints() const noexcept { return endpoints_; }
  bool tcp() const noexcept { return tcp_; }
  state current() const noexcept { return state_; }
  std::size_t pending() const noexcept { return pending_.size(); }

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
    if (slot.is_connected()) slot.template emplace<canceller>(req, ex_);
    const std::string& name = args.front();
    if (name == "SUBSCRIBE" || name == "PSUBSCRIBE" || name == "subscribe" || name == "psubscribe")
      subscriber_ = true;
    out_ += bytes;
    pending_.push_back(std::move(req));
    if (state_ == state::open) {
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
    on_message_ = nullptr;
    on_lost_ = nullptr;
    fail(redis::make_error_code(redis::errc::closed));
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
    socket_.close(ignored);
    socket_ = socket_type(ex_);
    if (reader_ != nullptr) redisReaderFree(reader_);
    reader_ = redisReaderCreate();
    if (reader_ == nullptr) throw std::bad_alloc();
    ++io_ops_;
    asio::async_connect(socket_, endpoints_,
                        [self = shared_from_this(), gen = gen_](
                            error_code ec, const endpoint_type&) { self->on_connect(gen, ec); });
  }

  void on_connect(unsigned gen, error_code ec) {
    --io_ops_;
    if (gen != gen_) return maybe_idle();
    if (ec) return fail(ec);
    if (tcp_) socket_.set_option(asio::ip::tcp::no_delay(true), ec);
    state_ = state::open;
    auto waiters = std::move(open_waiters_);
    open_waiters_.clear();
    for (auto& w : waiters) w.complete(error_code{});
    start_read();
    start_write();
  }

  void start_read() {
    ++io_ops_;
    socket_.async_read_some(asio::buffer(rbuf_),
                            [self = shared_from_this(), gen = gen_](error_code ec, std::size_t n) {
                              self->on_read(gen, ec, n);
                            });
  }

  void on_read(unsigned gen, error_code ec, std::size_t n) {
    --io_ops_;
    if (gen != gen_) return maybe_idle();
    if (ec) return fail(redis::make_error_code(redis::errc::connection_lost));
    if (redisReaderFeed(reader_, rbuf_.data(), n) != REDIS_OK)
      return fail(redis::make_error_code(redis::errc::protocol_error));
    for (;;) {
      void* raw = nullptr;
      if (redisReaderGetReply(reader_, &raw) != REDIS_OK)
        return fail(redis::make_error_code(redis::errc::protocol_error));
      if (raw == nullptr) break;
      redis::reply r = redis_convert(static_cast<const redisReply*>(raw));
      freeReplyObject(raw);
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
    if (req->handler) req->handler.complete(error_code{}, std::move(r));
  }

  void start_write() {
    if (write_active_ || out_.empty() || state_ != state::open) return;
    writing_.swap(out_);
    out_.clear();
    write_active_ = true;
    ++io_ops_;
    asio::async_write(socket_, asio::buffer(writing_),
                      [self = shared_from_this(), gen = gen_](error_code ec, std::size_t) {
                        self->on_write(gen, ec);
                      });
  }

  void on_write(unsigned gen, error_code ec) {
    --io_ops_;
    write_active_ = false;
    writing_.clear();
    if (gen != gen_) {
      start_write();  // bytes queued for a newer socket
      return maybe_idle();
    }
    if (ec) return fail(redis::make_error_code(redis::errc::connection_lost));
    start_write();
  }

  // Drops the socket and fails every call queued or waiting on it.
  void fail(error_code ec) {
    if (state_ != state::closed) state_ = state::broken;
    ++gen_;
    error_code ignored;
    socket_.close(ignored);
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
  std::vector<endpoint_type> endpoints_;
  bool tcp_;
  state state_ = state::broken;
  unsigned gen_ = 0;
  std::size_t io_ops_ = 0;
  bool write_active_ = false;
  bool subscriber_ = false;
  std::string out_;
  std::string writing_;
  std::deque<std::shared_ptr<redis_request>> pending_;
  redisReader* reader_ = nullptr;
  std::array<char, 16384> rbuf_{};
  std::function<void(const redis::reply&)> on_message_;
  std::function<void()> on_lost_;
  std::vector<erased_handler<error_code>> open_waiters_;
  std::vector<erased_handler<>> idle_waiters_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_REDIS_IO_HPP
