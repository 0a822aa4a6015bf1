// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_RATE_STATE_HPP
#define SLUICE_REDIS_DETAIL_RATE_STATE_HPP

// The state and scripts of redis::rate_limiter (rate_limiter.hpp), shared
// with redis::acquire_all.

#include <sluice/config.hpp>
#include <sluice/detail/stats_recorder.hpp>
#include <sluice/lock.hpp>
#include <sluice/redis/connection.hpp>
#include <sluice/redis/detail/script.hpp>

#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <utility>

namespace sluice::detail {

// KEYS: the window (zset member -> start time, server microseconds). ARGV:
// calls, per (us), n, member prefix, mode ('wait' or 'try'). Returns 0 when
// the n starts were recorded, else how many microseconds until the oldest
// start that blocks them leaves the window (-1 in 'try' mode).
inline constexpr const char* redis_rate_acquire_lua = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local calls, per, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - per)
local count = redis.call('ZCARD', KEYS[1])
if count + n <= calls then
  for i = 1, n do redis.call('ZADD', KEYS[1], now, ARGV[4] .. ':' .. i) end
  redis.call('PEXPIRE', KEYS[1], math.ceil(per / 1000) + 1000)
  return 0
end
if ARGV[5] == 'try' then return -1 end
local k = count + n - calls - 1
local oldest = redis.call('ZRANGE', KEYS[1], k, k, 'WITHSCORES')
local wait = tonumber(oldest[2]) + per - now
if wait < 1 then wait = 1 end
return wait
)lua";

// KEYS: the window. ARGV: calls, per (us). Returns how many starts fit now
// (read-only: the window is counted from now - per, not trimmed).
inline constexpr const char* redis_rate_status_lua = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local used = redis.call('ZCOUNT', KEYS[1], string.format('(%.0f', now - tonumber(ARGV[2])), '+inf')
return math.max(tonumber(ARGV[1]) - used, 0)
)lua";

struct redis_rate_state {
  std::shared_ptr<redis::connection> conn;
  std::string key;
  std::size_t calls;
  std::chrono::microseconds per;
  redis_script acquire{redis_rate_acquire_lua, {}};
  redis_script status{redis_rate_status_lua, {}};
  sluice::lock order;  // local waiters, FIFO: one at a time asks the server
  std::size_t waiting = 0;
  // stats(): this client's grants, throttles and cancelled waits, and its
  // starts of the last `per` by the local clock (oldest first; trimmed at
  // each grant, so at most about a window's worth).
  stats_sink stats;
  std::deque<std::pair<clock::time_point, std::size_t>> starts;

  void granted(std::size_t n, clock::time_point asked) {
    const auto now = clock::now();
    ++stats.acquired;
    stats.record_wait(now - asked);
    while (!starts.empty() && starts.front().first <= now - per) starts.pop_front();
    starts.emplace_back(now, n);
  }
  [[nodiscard]] std::size_t in_window() const noexcept {
    const auto now = clock::now();
    std::size_t units = 0;
    for (const auto& [at, n] : starts)
      if (at > now - per) units += n;
    return units;
  }
};

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_RATE_STATE_HPP
