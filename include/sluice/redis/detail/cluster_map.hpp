// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_CLUSTER_MAP_HPP
#define SLUICE_REDIS_DETAIL_CLUSTER_MAP_HPP

// The pure parts of Redis Cluster routing, testable without a server: the
// key -> slot function (CRC16/XMODEM mod 16384, with the {hash tag} rule),
// which argument of a command is its routing key, the MOVED/ASK error
// replies, and the CLUSTER SLOTS reply.

#include <sluice/config.hpp>
#include <sluice/redis/reply.hpp>

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::detail {

inline constexpr int redis_slot_count = 16384;

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the checksum of
// the Redis Cluster specification ("123456789" -> 0x31C3).
inline constexpr std::array<std::uint16_t, 256> redis_crc16_table = [] {
  std::array<std::uint16_t, 256> t{};
  for (unsigned i = 0; i < 256; ++i) {
    unsigned crc = i << 8;
    for (int b = 0; b < 8; ++b) crc = (crc & 0x8000U) != 0 ? (crc << 1) ^ 0x1021U : crc << 1;
    t[i] = static_cast<std::uint16_t>(crc & 0xFFFFU);
  }
  return t;
}();

constexpr std::uint16_t redis_crc16(std::string_view s) noexcept {
  unsigned crc = 0;
  for (unsigned char c : s)
    crc = ((crc << 8) ^ redis_crc16_table[((crc >> 8) ^ c) & 0xFFU]) & 0xFFFFU;
  return static_cast<std::uint16_t>(crc);
}

// The slot of `key`: only the part between the first '{' and the next '}' is
// hashed when that part is not empty (the hash tag), else the whole key.
constexpr int redis_key_slot(std::string_view key) noexcept {
  const auto open = key.find('{');
  if (open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close != open + 1)
      key = key.substr(open + 1, close - open - 1);
  }
  return redis_crc16(key) & (redis_slot_count - 1);
}

inline bool redis_iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto up = [](char c) {
      return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c;
    };
    if (up(a[i]) != up(b[i])) return false;
  }
  return true;
}

inline bool redis_is_one_of(std::string_view name, std::initializer_list<std::string_view> set) {
  for (auto s : set)
    if (redis_iequals(name, s)) return true;
  return false;
}

// Commands a cluster connection refuses: their effect spans several commands
// on one node, which a router that sends each command to its own slot's node
// cannot keep.
inline bool redis_cluster_refused(std::string_view name) {
  return redis_is_one_of(name, {"MULTI", "EXEC", "DISCARD", "WATCH", "UNWATCH"});
}

// An error reply that a later send of the same command may not get.
// TRYAGAIN: a multi-key command whose keys a migration split. "non local
// key": a script in a migrating slot deleted a key (a trim emptied it) and
// then wrote it again; Redis aborted it there, its effects so far stand
// (sluice's scripts only trim or re-draw a ticket by then), and it runs again
// where the key now belongs. CLUSTERDOWN: the cluster is failing over.
enum class redis_transient { no, again, down };
inline redis_transient redis_transient_error(std::string_view err) {
  if (err.rfind("TRYAGAIN", 0) == 0 ||
      err.find("non local key in a cluster node") != std::string_view::npos)
    return redis_transient::again;
  return err.rfind("CLUSTERDOWN", 0) == 0 ? redis_transient::down : redis_transient::no;
}

inline std::optional<std::size_t> redis_parse_count(std::string_view s) {
  std::size_t n = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return n;
}

// The index in `args` of the key that routes the command, or nullopt for a
// command without keys (it goes to the default node). A wrong guess is safe:
// the node answers MOVED and the router follows it.
inline std::optional<std::size_t> redis_command_key(const std::vector<std::string>& args) {
  if (args.size() < 2) return std::nullopt;
  const std::string& name = args[0];
  if (redis_is_one_of(
          name, {"PING",       "ECHO",         "INFO",         "TIME",      "SCRIPT",   "FUNCTION",
                 "CLUSTER",    "CONFIG",       "CLIENT",       "COMMAND",   "DBSIZE",   "FLUSHALL",
                 "FLUSHDB",    "KEYS",         "SCAN",         "RANDOMKEY", "PUBLISH",  "SUBSCRIBE",
                 "PSUBSCRIBE", "UNSUBSCRIBE",  "PUNSUBSCRIBE", "PUBSUB",    "AUTH",     "HELLO",
                 "SELECT",     "DEBUG",        "SLOWLOG",      "LATENCY",   "LASTSAVE", "SAVE",
                 "BGSAVE",     "BGREWRITEAOF", "ROLE",         "WAIT",      "READONLY", "READWRITE",
                 "ASKING",     "QUIT",         "RESET",        "SHUTDOWN",  "MONITOR",  "SWAPDB",
                 "REPLICAOF",  "SLAVEOF",      "MODULE",       "ACL",       "FAILOVER", "LOLWUT"}))
    return std::nullopt;
  if (redis_is_one_of(name, {"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO"})) {
    const auto n = args.size() > 2 ? redis_parse_count(args[2]) : std::nullopt;
    if (!n || *n == 0 || args.size() < 4) return std::nullopt;
    return 3;
  }
  if (redis_is_one_of(name,
                      {"ZUNION", "ZINTER", "ZDIFF", "ZINTERCARD", "SINTERCARD", "LMPOP", "ZMPOP"}))
    return args.size() > 2 ? std::optional<std::size_t>(2) : std::nullopt;
  if (redis_is_one_of(name, {"BLMPOP", "BZMPOP"}))
    return args.size() > 3 ? std::optional<std::size_t>(3) : std::nullopt;
  if (redis_is_one_of(name, {"XREAD", "XREADGROUP"})) {
    for (std::size_t i = 1; i + 1 < args.size(); ++i)
      if (redis_iequals(args[i], "STREAMS")) return i + 1;
    return std::nullopt;
  }
  if (redis_is_one_of(name, {"OBJECT", "MEMORY", "XINFO", "XGROUP"}))
    return args.size() > 2 ? std::optional<std::size_t>(2) : std::nullopt;
  return 1;
}

// The slot a command is routed by, or -1 for a command without keys.
inline int redis_command_slot(const std::vector<std::string>& args) {
  const auto k = redis_command_key(args);
  return k ? redis_key_slot(args[*k]) : -1;
}

// A node's address as the cluster reports it ("host:port").
struct redis_node_addr {
  std::string host;
  std::uint16_t port = 0;
  [[nodiscard]] std::string str() const { return host + ":" + std::to_string(port); }
  friend bool operator==(const redis_node_addr&, const redis_node_addr&) = default;
};

// Parses "host:port" (the host may be an IPv6 address with colons: the port
// follows the last one). An empty host stays empty (the caller substitutes
// the node that sent the reply, as the specification says).
inline std::optional<redis_node_addr> redis_parse_addr(std::string_view s) {
  const auto colon = s.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  const auto port = redis_parse_count(s.substr(colon + 1));
  if (!port || *port == 0 || *port > 65535) return std::nullopt;
  std::string_view host = s.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return redis_node_addr{std::string(host), static_cast<std::uint16_t>(*port)};
}

// "-MOVED <slot> <host:port>" (the slot now lives there: update the map) or
// "-ASK <slot> <host:port>" (this one command: ASKING, then the command there).
struct redis_redirect {
  bool ask = false;
  int slot = 0;
  redis_node_addr to;
};

inline std::optional<redis_redirect> redis_parse_redirect(std::string_view err) {
  redis_redirect r;
  if (err.rfind("MOVED ", 0) == 0) {
    err.remove_prefix(6);
  } else if (err.rfind("ASK ", 0) == 0) {
    r.ask = true;
    err.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const auto space = err.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const auto slot = redis_parse_count(err.substr(0, space));
  if (!slot || *slot >= static_cast<std::size_t>(redis_slot_count)) return std::nullopt;
  auto to = redis_parse_addr(err.substr(space + 1));
  if (!to) return std::nullopt;
  r.slot = static_cast<int>(*slot);
  r.to = std::move(*to);
  return r;
}

// One range of CLUSTER SLOTS: slots [first, last] served by the primary `at`.
struct redis_slot_range {
  int first = 0;
  int last = 0;
  redis_node_addr at;
};

// Parses a CLUSTER SLOTS reply: [[first, last, [host, port, id, ...], replicas...], ...].
// A primary reported with an empty or "?" host is `asked` (the node that
// answered). Throws std::runtime_error for a reply of another shape.
inline std::vector<redis_slot_range> redis_parse_slots(const redis::reply& r,
                                                       const std::string& asked) {
  const auto bad = [] {
    return std::runtime_error("sluice::redis: unexpected CLUSTER SLOTS reply");
  };
  if (r.kind != redis::reply_kind::array) throw bad();
  std::vector<redis_slot_range> out;
  for (const auto& e : r.elements) {
    if (e.kind != redis::reply_kind::array || e.elements.size() < 3) throw bad();
    const auto& node = e.elements[2];
    if (node.kind != redis::reply_kind::array || node.elements.size() < 2) throw bad();
    const auto first = e.elements[0].integer, last = e.elements[1].integer;
    const auto port = node.elements[1].integer;
    if (first < 0 || last < first || last >= redis_slot_count || port <= 0 || port > 65535)
      throw bad();
    std::string host = node.elements[0].str;
    if (host.empty() || host == "?") host = asked;
    out.push_back({static_cast<int>(first),
                   static_cast<int>(last),
                   {std::move(host), static_cast<std::uint16_t>(port)}});
  }
  return out;
}

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_CLUSTER_MAP_HPP
