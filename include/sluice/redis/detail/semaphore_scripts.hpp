// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_SEMAPHORE_SCRIPTS_HPP
#define SLUICE_REDIS_DETAIL_SEMAPHORE_SCRIPTS_HPP

// The Lua scripts of redis::semaphore. Every script gets the same KEYS:
//   1 holders  zset permit id -> lease expiry (server ms)
//   2 queue    zset waiter id -> ticket
//   3 alive    zset waiter id -> expiry of a waiter that stopped polling
//   4 ticket   counter of the queue's tickets
//   5 meta     hash: run_id (the server that wrote the keys), grace_until
//   6 fence    the last fencing token handed out
// Times are the server's (TIME), so the clients' clocks do not matter.

#include <sluice/config.hpp>

#include <string>

namespace sluice::detail {

// Shared head: `now` (server ms), and on a semaphore's six keys `K` (S: the
// script's own, KEYS[1..6]) `settle(K, grace)`, `seed(K, seen)`, `fence(K)`
// and `expire(K)`; redis::acquire_all's script calls them on each semaphore.
//
// settle: returns grace_until, and true when it saw a change now.
// A run_id other than the recorded one means a restart (perhaps from
// an old snapshot) or a failover. New grants then wait until `grace_until`,
// one renewal interval plus a margin after the change was seen (after the
// server's start when nothing was recorded: a fresh or emptied server), so
// that every live holder re-claims first; the entries of holders that do not
// renew in that time expire at its end, and so do those of waiters that do
// not ask again in that time (waiters of the old node whose clean-up was
// lost with it: they never block the queue of the new one).
//
// seed(K, seen): the fence moves up to the highest token the calling client has
// seen (every acquire and renewal carries it), so that a node that lost the
// tail of the fence (replica lag, an old snapshot) never hands out a token at
// or below one a live client saw, whatever its clock.
//
// fence: tokens are max(last + 1, now * 1000): strictly increasing on one
// server, and above every seeded token.
inline const std::string redis_sem_head = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function settle(K, grace)
  local info = redis.call('INFO', 'server')
  local run = string.match(info, 'run_id:(%w+)')
  local rec = redis.call('HGET', K[5], 'run_id')
  if rec == run then return tonumber(redis.call('HGET', K[5], 'grace_until')), false end
  local from = now
  if not rec then
    -- whole seconds of two truncated clocks: the start may be up to 1 s later
    local up = tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
    from = now - math.max(up - 1, 0) * 1000
  end
  local gu = from + grace
  redis.call('HSET', K[5], 'run_id', run, 'grace_until', string.format('%.0f', gu))
  if gu > now then
    for _, k in ipairs({K[1], K[3]}) do
      local es = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES')
      for i = 1, #es, 2 do
        if tonumber(es[i + 1]) > gu then redis.call('ZADD', k, gu, es[i]) end
      end
    end
  end
  return gu, true
end
local function seed(K, seen)
  if seen > (tonumber(redis.call('GET', K[6])) or 0) then
    redis.call('SET', K[6], string.format('%.0f', seen))
  end
end
local function fence(K)
  local f = math.max((tonumber(redis.call('GET', K[6])) or 0) + 1, now * 1000)
  redis.call('SET', K[6], string.format('%.0f', f))
  return f
end
local function expire(K)
  redis.call('ZREMRANGEBYSCORE', K[1], '-inf', now)
  local dead = redis.call('ZRANGEBYSCORE', K[3], '-inf', now)
  for i = 1, #dead do redis.call('ZREM', K[2], dead[i]) end
  redis.call('ZREMRANGEBYSCORE', K[3], '-inf', now)
end
local S = {KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]}
)lua";

// ARGV: permits, id, lease, waiter ttl, mode ('try' | 'wait'), grace, seen.
// Returns {granted, rank, fencing token}.
inline const std::string redis_sem_acquire_lua = redis_sem_head + R"lua(
local permits, id, lease, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local settled = now >= settle(S, tonumber(ARGV[6]))
seed(S, tonumber(ARGV[7]))
expire(S)
local free = permits - redis.call('ZCARD', KEYS[1])
if ARGV[5] == 'try' then
  if settled and free > 0 and redis.call('ZCARD', KEYS[2]) == 0 then
    redis.call('ZADD', KEYS[1], now + lease, id)
    return {1, 0, fence(S)}
  end
  return {0, -1, 0}
end
if not redis.call('ZSCORE', KEYS[2], id) then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), id)
end
redis.call('ZADD', KEYS[3], now + ttl, id)
local rank = redis.call('ZRANK', KEYS[2], id)
if settled and rank < free then
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZADD', KEYS[1], now + lease, id)
  return {1, rank, fence(S)}
end
return {0, rank, 0}
)lua";

// ARGV: permits, lease, grace, seen, ids... Returns 1 (renewed) or 0 (lost) per id.
// A permit whose entry is gone is re-claimed only during the grace after a
// restart (when no new grant is made); otherwise it is lost, so a holder
// that was cut off never re-claims ahead of the queue.
inline const std::string redis_sem_renew_lua = redis_sem_head + R"lua(
local permits, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local grace_until = settle(S, tonumber(ARGV[3]))
seed(S, tonumber(ARGV[4]))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local out = {}
for i = 5, #ARGV do
  local id = ARGV[i]
  if redis.call('ZSCORE', KEYS[1], id) or
     (now < grace_until and redis.call('ZCARD', KEYS[1]) < permits) then
    redis.call('ZADD', KEYS[1], now + lease, id)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
)lua";

// ARGV: id, channel. Drops the id wherever it is (a release, a waiter that
// gives up, an acquire cancelled in flight) and wakes the waiters.
inline const std::string redis_sem_drop_lua = R"lua(
local n = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('PUBLISH', ARGV[2], 'release')
return n
)lua";

// ARGV: permits. Returns {free, waiting}.
inline const std::string redis_sem_status_lua = redis_sem_head + R"lua(
expire(S)
local free = tonumber(ARGV[1]) - redis.call('ZCARD', KEYS[1])
if free < 0 then free = 0 end
return {free, redis.call('ZCARD', KEYS[2])}
)lua";

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_SEMAPHORE_SCRIPTS_HPP
