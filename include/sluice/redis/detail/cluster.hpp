// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_CLUSTER_HPP
#define SLUICE_REDIS_DETAIL_CLUSTER_HPP

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/redis/detail/cluster_map.hpp>
#include <sluice/redis/detail/cluster_routing.hpp>
#include <sluice/redis/detail/io.hpp>
#include <sluice/redis/detail/request.hpp>
#include <sluice/redis/options.hpp>
#include <sluice/redis/reply.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_timer.hpp>

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sluice::detail {

// The state behind a cluster redis::connection: a router over one redis_io
// per node it uses (each applying the options: AUTH, TLS, timeouts; the nodes
// and the slot map are redis_cluster_nodes, cluster_routing.hpp).
//
// Invariants:
// - Order per slot: a slot's line sends to one node at a time. A command is
//   sent at once only if its line's queue is empty and its in-flight commands
//   (if any) went to the node it would go to; otherwise it queues. A command
//   answered with a redirect (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, NOSCRIPT of
//   a known script) did not run: it re-enters its line's queue ahead of the
//   commands submitted after it, and a queue is drained only once nothing of
//   its line is in flight: a re-sent command alone (wait for its reply), then
//   every fresh command behind it, pipelined.
// - ops_ counts the armed retry timers; close() waits for 0 and each node's I/O.
// - A command completes exactly once, through a post (erased_handler).
class redis_cluster : public std::enable_shared_from_this<redis_cluster> {
 public:
  using clock = std::chrono::steady_clock;
  using cmd_ptr = std::shared_ptr<redis_cluster_cmd>;
  static constexpr int max_redirects = 16;

  redis_cluster(asio::any_io_executor ex, redis::options opts)
      : ex_(std::move(ex)), nodes_(ex_, std::move(opts)) {}
  redis_cluster(const redis_cluster&) = delete;
  redis_cluster& operator=(const redis_cluster&) = delete;

  const asio::any_io_executor& executor() const noexcept { return ex_; }
  const redis::options& opts() const noexcept { return nodes_.opts(); }
  std::size_t pending() const noexcept { return alive_; }
  redis_io::state current() const noexcept {
    return closed_ ? redis_io::state::closed : default_io().current();
  }
  // The primaries of the last map, the default node first (connect_again()'s seeds).
  std::vector<redis_node_addr> primaries() const { return nodes_.primaries(); }
  int owner(int slot) const { return nodes_.owner(slot); }
  const redis_node_addr& addr(int node) const { return nodes_.addr(node); }

  // The node for `a` (its index), opening a redis_io for it on first use.
  int node(const redis_node_addr& a) { return nodes_.node(a); }

  // Queues one command; the handler gets (error_code, reply). Throws
  // std::invalid_argument for an empty or a refused command.
  template <class Handler>
  void submit(std::vector<std::string> args, Handler&& handler) {
    if (args.empty())
      throw std::invalid_argument("sluice::redis: a command needs at least its name");
    if (redis_cluster_refused(args[0]))
      throw std::invalid_argument(
          "sluice::redis: a cluster connection does not run " + args[0] +
          " (each command goes to its own slot's node); use a Lua script (EVAL) whose keys "
          "share one {hash tag}");
    if (closed_) {
      post_completion(std::forward<Handler>(handler), ex_,
                      redis::make_error_code(redis::errc::closed), redis::reply{});
      return;
    }
    auto slot = asio::get_associated_cancellation_slot(handler);
    auto c = std::make_shared<redis_cluster_cmd>();
    c->slot = redis_command_slot(args);
    c->args = std::move(args);
    c->handler = erased_handler<error_code, redis::reply>(std::forward<Handler>(handler), ex_);
    if (slot.is_connected()) slot.template emplace<redis_canceller<redis_cluster_cmd>>(c, ex_);
    ++alive_;
    line& l = lines_[c->slot];
    const int to = nodes_.target(c->slot);
    if (!l.queue.empty() || (l.inflight > 0 && l.node != to)) {
      l.queue.push_back(std::move(c));
      return;
    }
    send(l, c, to);
  }

  // Starts a CLUSTER SLOTS refresh (or joins the running one); the handler
  // gets (error_code, server error text) of the last node asked when none answered.
  template <class Handler>
  void refresh(Handler&& handler) {
    refresh_waiters_.emplace_back(std::forward<Handler>(handler), ex_);
    request_refresh();
  }

  template <class Handler>
  void wait_open(Handler&& handler) {
    if (closed_) {
      post_completion(std::forward<Handler>(handler), ex_,
                      redis::make_error_code(redis::errc::closed));
      return;
    }
    default_io().wait_open(std::forward<Handler>(handler));
  }

  // Completes once no socket operation or retry timer is outstanding.
  template <class Handler>
  void wait_idle(Handler&& handler) {
    auto j = std::make_shared<idle_join>();
    j->left = nodes_.ios().size() + 1;
    j->h = erased_handler<>(std::forward<Handler>(handler), ex_);
    for (auto& io : nodes_.ios()) io->wait_idle([j] { j->done(); });
    idle_waiters_.push_back(std::move(j));
    maybe_idle();
  }

  void on_message(std::function<void(const redis::reply&)> f) {
    on_message_ = std::move(f);
    if (!closed_) default_io().on_message(on_message_);
  }
  void on_lost(std::function<void()> f) {
    on_lost_ = std::move(f);
    if (!closed_) default_io().on_lost(on_lost_);
  }

  // Closes for good: queued, in-flight and later calls fail with errc::closed.
  void shutdown() {
    if (closed_) return;
    closed_ = true;
    on_message_ = nullptr;
    on_lost_ = nullptr;
    for (auto& [slot, l] : lines_) {
      if (l.timer) l.timer->cancel();
      auto q = std::move(l.queue);
      l.queue.clear();
      if (l.alone) {  // in flight: its reply (closed) ends it
        l.queue.push_back(std::move(q.front()));
        q.pop_front();
      }
      for (auto& c : q) finish(c, redis::make_error_code(redis::errc::closed), {});
    }
    for (auto& io : nodes_.ios()) io->shutdown();
    auto w = std::move(refresh_waiters_);
    refresh_waiters_.clear();
    for (auto& h : w) h.complete(redis::make_error_code(redis::errc::closed), std::string());
  }

 private:
  // The commands of one slot (see the class invariants).
  struct line {
    std::size_t inflight = 0;
    int node = -1;              // where the in-flight commands went
    std::deque<cmd_ptr> queue;  // re-sends first (`resends` of them), then fresh ones
    std::size_t resends = 0;    // re-sends queued while others were in flight
    bool alone = false;         // queue.front() was sent alone; its reply is awaited
    std::unique_ptr<asio::steady_timer> timer;  // armed: queue.front() waits out a delay
    bool waiting = false;
  };

  struct idle_join {
    std::size_t left = 0;
    erased_handler<> h;
    void done() {
      if (--left == 0) h.complete();
    }
  };

  redis_io& default_io() const { return nodes_.io(nodes_.default_node()); }

  void send(line& l, const cmd_ptr& c, int to) {
    ++l.inflight;
    l.node = to;
    auto& io = nodes_.io(to);
    if (c->load)
      io.submit({"SCRIPT", "LOAD", scripts_.at(c->args.at(1))},
                [](error_code, const redis::reply&) {});
    if (c->ask) io.submit({"ASKING"}, [](error_code, const redis::reply&) {});  // just before it
    c->asked = c->ask.has_value();
    c->ask.reset();
    c->load = false;
    io.submit(c->args, [self = shared_from_this(), c, to](error_code ec, redis::reply r) {
      self->on_reply(c, to, ec, std::move(r));
    });
  }

  void finish(const cmd_ptr& c, error_code ec, redis::reply r) {
    --alive_;
    if (c->handler) c->handler.complete(ec, std::move(r));
  }

  std::chrono::milliseconds budget() const {
    return opts().command_timeout.count() > 0 ? opts().command_timeout
                                              : std::chrono::milliseconds(5000);
  }

  // Whether `c`, answered `r` by node `from`, must be sent again (and how).
  bool redirected(const cmd_ptr& c, int from, const redis::reply& r) {
    if (!r.is_error()) return false;
    if (auto rd = redis_parse_redirect(r.str)) {
      if (++c->redirects > max_redirects) return false;
      if (rd->to.host.empty()) rd->to.host = nodes_.addr(from).host;
      if (rd->ask) {
        c->ask = rd->to;
        node(rd->to);
      } else {
        nodes_.set_owner(rd->slot, node(rd->to));
        request_refresh();
      }
      return true;
    }
    if (const auto t = redis_transient_error(r.str); t != redis_transient::no) {
      if (!c->back_off(budget())) return false;
      if (t == redis_transient::down) request_refresh();
      return true;
    }
    if (r.str.rfind("NOSCRIPT", 0) == 0 && !c->reloaded &&
        redis_is_one_of(c->args[0], {"EVALSHA", "EVALSHA_RO"}) &&
        scripts_.count(c->args.at(1)) != 0) {
      c->reloaded = true;
      c->load = true;
      if (c->asked) c->ask = nodes_.addr(from);  // the node that said NOSCRIPT, again after ASKING
      return true;
    }
    return false;
  }

  void on_reply(const cmd_ptr& c, int from, error_code ec, redis::reply r) {
    line& l = lines_[c->slot];
    --l.inflight;
    const bool was_alone = l.alone && !l.queue.empty() && l.queue.front() == c;
    if (was_alone) l.alone = false;
    if (closed_) {
      if (was_alone) l.queue.pop_front();
      finish(c, ec ? ec : redis::make_error_code(redis::errc::closed), {});
      return;
    }
    if (!ec && redirected(c, from, r)) {
      if (!was_alone) {  // answered in a pipeline: ahead of the fresh commands behind it
        l.queue.insert(l.queue.begin() + static_cast<std::ptrdiff_t>(l.resends), c);
        ++l.resends;
      }
    } else {
      if (was_alone) l.queue.pop_front();
      if (ec && ec != redis::make_error_code(redis::errc::closed)) request_refresh();
      if (!ec && !r.is_error() && redis_iequals(c->args[0], "SCRIPT") && c->args.size() > 2 &&
          redis_iequals(c->args[1], "LOAD"))
        scripts_[r.str] = c->args[2];
      finish(c, ec, std::move(r));
    }
    pump(c->slot);
  }

  // Sends what a line's queue holds once nothing of the line is in flight.
  void pump(int slot) {
    const auto it = lines_.find(slot);
    if (it == lines_.end()) return;
    line& l = it->second;
    if (closed_ || l.inflight > 0 || l.waiting) return;
    if (l.queue.empty()) {
      lines_.erase(it);
      return;
    }
    l.resends = 0;
    cmd_ptr front = l.queue.front();
    if (front->delay.count() > 0) {
      if (!l.timer) l.timer = std::make_unique<asio::steady_timer>(ex_);
      l.timer->expires_after(std::exchange(front->delay, std::chrono::milliseconds(0)));
      l.waiting = true;
      ++ops_;
      l.timer->async_wait([self = shared_from_this(), slot](error_code) {
        --self->ops_;
        const auto i = self->lines_.find(slot);
        if (i != self->lines_.end()) i->second.waiting = false;
        self->pump(slot);
        self->maybe_idle();
      });
      return;
    }
    if (front->redirects > 0 || front->retries > 0 || front->reloaded) {
      l.alone = true;
      const int to = front->ask ? node(*front->ask) : nodes_.target(slot);
      send(l, front, to);
      return;
    }
    const int to = nodes_.target(slot);
    auto q = std::move(l.queue);
    l.queue.clear();
    for (auto& c : q) send(l, c, to);
  }

  void request_refresh() {
    if (refreshing_) {
      again_ = true;
      return;
    }
    if (closed_ || nodes_.ios().empty()) {
      auto w = std::move(refresh_waiters_);
      refresh_waiters_.clear();
      for (auto& h : w) h.complete(redis::make_error_code(redis::errc::closed), std::string());
      return;
    }
    refreshing_ = true;
    std::vector<int> order{nodes_.default_node()};
    for (int i = 0; i < static_cast<int>(nodes_.ios().size()); ++i)
      if (i != nodes_.default_node()) order.push_back(i);
    ask_slots(std::move(order), 0, {}, {});
  }

  // Asks order[i] for CLUSTER SLOTS; on failure the next node.
  void ask_slots(std::vector<int> order, std::size_t i, error_code last, std::string text) {
    if (closed_) return refreshed(redis::make_error_code(redis::errc::closed), {});
    if (i >= order.size())
      return refreshed(last ? last : redis::make_error_code(redis::errc::protocol_error),
                       std::move(text));
    const int n = order[i];
    nodes_.io(n).submit({"CLUSTER", "SLOTS"}, [self = shared_from_this(), order = std::move(order),
                                               i, n](error_code ec, redis::reply r) mutable {
      if (!ec && !r.is_error()) {
        try {
          self->set_default(self->nodes_.apply(redis_parse_slots(r, self->nodes_.addr(n).host)));
          return self->refreshed({}, {});
        } catch (const std::exception& e) {
          r.str = e.what();
        }
      }
      if (!ec) ec = redis::make_error_code(redis::errc::protocol_error);
      self->ask_slots(std::move(order), i + 1, ec, r.str);
    });
  }

  void refreshed(error_code ec, std::string text) {
    refreshing_ = false;
    auto w = std::move(refresh_waiters_);
    refresh_waiters_.clear();
    for (auto& h : w) h.complete(ec, text);
    if (again_ && !closed_) {
      again_ = false;
      request_refresh();
    }
  }

  // The default node (commands without keys, SUBSCRIBE) moves to a node that
  // serves slots; the pub/sub hooks move with it, and the lost hook runs (a
  // subscriber subscribes again, now there).
  void set_default(int n) {
    if (n == nodes_.default_node()) return;
    default_io().on_message(nullptr);
    default_io().on_lost(nullptr);
    nodes_.set_default_node(n);
    nodes_.io(n).on_message(on_message_);
    nodes_.io(n).on_lost(on_lost_);
    if (on_lost_) asio::post(ex_, [f = on_lost_] { f(); });
  }

  void maybe_idle() {
    if (ops_ != 0) return;
    auto w = std::move(idle_waiters_);
    idle_waiters_.clear();
    for (auto& j : w) j->done();
  }

  asio::any_io_executor ex_;
  redis_cluster_nodes nodes_;
  std::unordered_map<int, line> lines_;                   // slot -> its line, while busy
  std::unordered_map<std::string, std::string> scripts_;  // sha -> source (SCRIPT LOAD)
  std::size_t alive_ = 0;
  std::size_t ops_ = 0;
  bool closed_ = false;
  bool refreshing_ = false;
  bool again_ = false;
  std::function<void(const redis::reply&)> on_message_;
  std::function<void()> on_lost_;
  std::vector<erased_handler<error_code, std::string>> refresh_waiters_;
  std::vector<std::shared_ptr<idle_join>> idle_waiters_;
};

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_CLUSTER_HPP
