// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_CLUSTER_ROUTING_HPP
#define SLUICE_REDIS_DETAIL_CLUSTER_ROUTING_HPP

// Where a cluster connection's commands go: one command's routing state
// (redirects followed, ASK, NOSCRIPT), the nodes the connection uses (one
// redis_io each, applying the options) and the slot map as last learnt.
// redis_cluster (cluster.hpp) keeps each slot's order and the refreshes.

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/redis/detail/cluster_map.hpp>
#include <sluice/redis/detail/io.hpp>
#include <sluice/redis/options.hpp>
#include <sluice/redis/reply.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_net.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sluice::detail {

// One call through a cluster connection, from submit() to its completion.
struct redis_cluster_cmd {
  std::vector<std::string> args;
  int slot = -1;                                     // -1: no key (the default node)
  erased_handler<error_code, redis::reply> handler;  // empty once completed (or cancelled)
  std::optional<redis_node_addr> ask;                // next send: ASKING, then the command there
  bool asked = false;                                // the last send was after an ASKING
  bool load = false;                                 // next send: SCRIPT LOAD <source> first
  bool reloaded = false;                             // NOSCRIPT handled once
  int redirects = 0;                                 // MOVED/ASK followed
  int retries = 0;                                   // TRYAGAIN/CLUSTERDOWN waited out
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::chrono::milliseconds delay{0};  // wait before the next send

  // Answered a redis_transient error: whether to send again after `delay`
  // (1, 2, 4 ... ms, at most 100), given `budget` from submit() on.
  bool back_off(std::chrono::milliseconds budget) {
    if (std::chrono::steady_clock::now() - started >= budget) return false;
    delay = std::min(std::chrono::milliseconds(1 << std::min(retries, 7)),
                     std::chrono::milliseconds(100));
    ++retries;
    return true;
  }
};

// The nodes of a cluster connection and the slot map.
//
// Invariants: owner(slot) is the node index serving the slot as last learnt
// (a CLUSTER SLOTS reply or a MOVED), -1 if unknown (sent to the default
// node); a node's index never changes (nodes are never removed).
class redis_cluster_nodes {
 public:
  redis_cluster_nodes(asio::any_io_executor ex, redis::options opts)
      : ex_(std::move(ex)), opts_(std::move(opts)), owner_(redis_slot_count, -1) {}

  const redis::options& opts() const noexcept { return opts_; }
  const std::vector<std::shared_ptr<redis_io>>& ios() const noexcept { return ios_; }
  redis_io& io(int node) const { return *ios_.at(node); }
  const redis_node_addr& addr(int node) const { return addrs_.at(node); }
  int owner(int slot) const { return owner_.at(slot); }
  void set_owner(int slot, int node) { owner_.at(static_cast<std::size_t>(slot)) = node; }
  // The node for commands without keys (and SUBSCRIBE).
  int default_node() const noexcept { return default_; }
  void set_default_node(int node) noexcept { default_ = node; }

  // The primaries of the last map, the default node first (connect_again()'s seeds).
  std::vector<redis_node_addr> primaries() const {
    std::vector<redis_node_addr> out{addrs_.at(default_)};
    for (int i : owner_)
      if (i >= 0 && std::find(out.begin(), out.end(), addrs_[i]) == out.end())
        out.push_back(addrs_[i]);
    return out;
  }

  // The node `slot` goes to now: its owner, else the default node.
  int target(int slot) const {
    return slot >= 0 && owner_[static_cast<std::size_t>(slot)] >= 0
               ? owner_[static_cast<std::size_t>(slot)]
               : default_;
  }

  // The node for `a` (its index), opening a redis_io for it on first use.
  int node(const redis_node_addr& a) {
    const auto it = index_.find(a.str());
    if (it != index_.end()) return it->second;
    std::vector<redis_io::endpoint_type> eps;
    error_code ec;
    const auto ip = asio::ip::make_address(a.host, ec);
    if (!ec) {
      eps.emplace_back(asio::ip::tcp::endpoint(ip, a.port));
    } else {  // a node announced by name: resolved once, blocking (rare: hostname endpoints)
      asio::ip::tcp::resolver resolver(ex_);
      for (const auto& e : resolver.resolve(a.host, std::to_string(a.port), ec))
        eps.emplace_back(e.endpoint());
    }
    redis::options o = opts_;
    o.host = a.host;
    o.port = a.port;
    ios_.push_back(std::make_shared<redis_io>(ex_, std::move(eps), true, std::move(o)));
    addrs_.push_back(a);
    const int i = static_cast<int>(ios_.size() - 1);
    index_.emplace(a.str(), i);
    return i;
  }

  // Takes a CLUSTER SLOTS reply's ranges as the map; returns the node the
  // default should be (the current one if it serves slots, else the first
  // range's). Throws std::runtime_error when the cluster serves no slot.
  int apply(const std::vector<redis_slot_range>& ranges) {
    if (ranges.empty()) throw std::runtime_error("CLUSTERDOWN: the cluster serves no slot");
    std::vector<int> owners(redis_slot_count, -1);
    bool default_serves = false;
    for (const auto& r : ranges) {
      const int n = node(r.at);
      default_serves = default_serves || n == default_;
      std::fill(owners.begin() + r.first, owners.begin() + r.last + 1, n);
    }
    owner_ = std::move(owners);
    return default_serves ? default_ : node(ranges.front().at);
  }

 private:
  asio::any_io_executor ex_;
  redis::options opts_;
  std::vector<std::shared_ptr<redis_io>> ios_;  // one per node used, never removed
  std::vector<redis_node_addr> addrs_;          // same index
  std::unordered_map<std::string, int> index_;  // "host:port" -> index
  std::vector<int> owner_;                      // slot -> node index, -1 unknown
  int default_ = 0;
};

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_CLUSTER_ROUTING_HPP
