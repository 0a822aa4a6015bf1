// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_ALL_SCRIPTS_HPP
#define SLUICE_REDIS_DETAIL_ALL_SCRIPTS_HPP

// The Lua scripts of redis::acquire_all. KEYS: each budget's keys in the
// call's order; a semaphore's six (semaphore_scripts.hpp), a rate limiter's
// five:
//   window   zset start member -> start time (server us), as rate_limiter's
//   queue    zset waiter id -> ticket (acquire_all callers only)
//   alive    zset waiter id -> expiry of a waiter that stopped asking (ms)
//   ticket   counter of the queue's tickets
//   weights  hash waiter id -> the units it asks for
// ARGV: id, waiter ttl (ms), number of budgets, then per budget
//   's', permits, lease (ms), grace (ms), highest token seen, release channel
//   'r', calls, per (us), n
//
// Order: a caller that cannot be served is queued on every budget of its
// call in the same script, with a fresh ticket of each (or, if an entry of
// it expired somewhere, queued again on all of them): two callers that share
// budgets are in the same order on each, so no two wait for each other. It
// is served only when, on every budget, its older waiters still fit beside
// it: fewer older waiters than free permits (as the semaphore's own rule),
// and the window's starts + the units of older waiters + its own <= calls.
//
// Restarts: a semaphore's settle() that sees a new run_id caps the liveness
// of its own waiters and of the call's rate queues at the end of the grace,
// so that waiters of the old node that do not ask again never block the new
// one (a call of rate limiters only has no run_id: its stale waiters leave
// after their ttl).

#include <sluice/config.hpp>
#include <sluice/redis/detail/semaphore_scripts.hpp>

#include <string>

namespace sluice::detail {

// The budgets of the call, parsed from KEYS and ARGV into B.
inline const std::string redis_all_parse = R"lua(
local id = ARGV[1]
local B = {}
local k, a = 1, 4
for i = 1, tonumber(ARGV[3]) do
  local b = {kind = ARGV[a]}
  if b.kind == 's' then
    b.K = {KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5]}
    b.queue, b.alive, b.ticket = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
    b.permits, b.lease = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    b.grace, b.seen, b.channel = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), ARGV[a + 5]
    k, a = k + 6, a + 6
  else
    b.win, b.queue, b.alive, b.ticket, b.weights =
      KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]
    b.calls, b.per, b.n = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    k, a = k + 5, a + 4
  end
  B[#B + 1] = b
end
)lua";

// Returns {1, 0, token of each semaphore...} when every budget was taken,
// else {0, hint}: hint is how many microseconds until the window that blocks
// the call has room (-1: unknown, a semaphore or the queue blocks).
inline const std::string redis_all_acquire_lua = redis_sem_head + redis_all_parse + R"lua(
local ttl = tonumber(ARGV[2])
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local settled, restarted = true, nil
for _, b in ipairs(B) do
  if b.kind == 's' then
    local gu, changed = settle(b.K, b.grace)
    if now < gu then settled = false end
    if changed and gu > now then restarted = gu end
    seed(b.K, b.seen)
    expire(b.K)
  else
    redis.call('ZREMRANGEBYSCORE', b.win, '-inf', now_us - b.per)
    local dead = redis.call('ZRANGEBYSCORE', b.alive, '-inf', now)
    for i = 1, #dead do
      redis.call('ZREM', b.queue, dead[i])
      redis.call('HDEL', b.weights, dead[i])
    end
    redis.call('ZREMRANGEBYSCORE', b.alive, '-inf', now)
  end
end
if restarted then  -- the rate queues' waiters of the old node: gone after the grace too
  for _, b in ipairs(B) do
    if b.win then
      local es = redis.call('ZRANGE', b.alive, 0, -1, 'WITHSCORES')
      for i = 1, #es, 2 do
        if tonumber(es[i + 1]) > restarted then redis.call('ZADD', b.alive, restarted, es[i]) end
      end
    end
  end
end
local queued = true
for _, b in ipairs(B) do
  if not redis.call('ZSCORE', b.queue, id) then queued = false end
end
for _, b in ipairs(B) do
  if not queued then
    redis.call('ZADD', b.queue, redis.call('INCR', b.ticket), id)
    if b.weights then redis.call('HSET', b.weights, id, b.n) end
  end
  redis.call('ZADD', b.alive, now + ttl, id)
end
local ok, hint = settled, -1
for _, b in ipairs(B) do
  local rank = redis.call('ZRANK', b.queue, id)
  if b.kind == 's' then
    if rank >= b.permits - redis.call('ZCARD', b.K[1]) then ok = false end
  else
    local older = 0
    if rank > 0 then
      for _, o in ipairs(redis.call('ZRANGE', b.queue, 0, rank - 1)) do
        older = older + (tonumber(redis.call('HGET', b.weights, o)) or 0)
      end
    end
    local count = redis.call('ZCARD', b.win)
    local over = count + older + b.n - b.calls
    if over > 0 then
      ok = false
      if over <= count then
        local e = redis.call('ZRANGE', b.win, over - 1, over - 1, 'WITHSCORES')
        hint = math.max(hint, tonumber(e[2]) + b.per - now_us, 1)
      end
    end
  end
end
if not ok then return {0, hint} end
local out = {1, 0}
for _, b in ipairs(B) do
  redis.call('ZREM', b.queue, id)
  redis.call('ZREM', b.alive, id)
  if b.kind == 's' then
    redis.call('ZADD', b.K[1], now + b.lease, id)
    out[#out + 1] = fence(b.K)
  else
    redis.call('HDEL', b.weights, id)
    for i = 1, b.n do redis.call('ZADD', b.win, now_us, id .. ':' .. i) end
    redis.call('PEXPIRE', b.win, math.ceil(b.per / 1000) + 1000)
  end
end
return out
)lua";

// Same KEYS and ARGV. Takes back whatever the call `id` holds or queued:
// its permits, its starts, its places in the queues; wakes the semaphores'
// waiters.
inline const std::string redis_all_drop_lua = redis_all_parse + R"lua(
for _, b in ipairs(B) do
  redis.call('ZREM', b.queue, id)
  redis.call('ZREM', b.alive, id)
  if b.kind == 's' then
    redis.call('ZREM', b.K[1], id)
    redis.call('PUBLISH', b.channel, 'release')
  else
    redis.call('HDEL', b.weights, id)
    for i = 1, b.n do redis.call('ZREM', b.win, id .. ':' .. i) end
  end
end
return 1
)lua";

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_ALL_SCRIPTS_HPP
