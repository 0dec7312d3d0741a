-- Claim an idle episode: only the caller that ends it gets its snapshot back.
-- KEYS: episode, remembered id, placements. ARGV: now, idle timeout s, retention ms,
-- remember ms.
-- A turn still in flight holds an active episode open, but only for twice the idle timeout:
-- the replica serving it may have died without settling. An episode already ended with
-- turns in flight (end_pending), whose ending those turns' settling completes, waits one
-- idle timeout: it takes no more calls, and its record should not wait on a dead replica.
local ep, gone = KEYS[1], KEYS[2]
local f = redis.call('HMGET', ep, 'status', 'inflight', 'last_activity', 'end_pending')
if not f[1] then
  return cjson.encode({'missing'})
end
local pending = f[1] == 'finished' and f[4] == '1'
if f[1] == 'finished' and not pending then
  return cjson.encode({'ended'})
end
local idle = tonumber(ARGV[2])
local idle_for = tonumber(ARGV[1]) - tonumber(f[3])
if idle_for < idle then
  return cjson.encode({'fresh', f[3]})
end
if tonumber(f[2]) > 0 and not pending and idle_for < 2 * idle then
  return cjson.encode({'busy', f[3]})
end
if pending then
  -- already ended; its turns never settled: record it as it stands
  redis.call('HSET', ep, 'end_pending', '0')
  redis.call('PEXPIRE', ep, math.max(1, tonumber(ARGV[3])))
  return cjson.encode({'claimed', snapshot(ep)})
end
return cjson.encode({'claimed',
  end_episode(ep, gone, KEYS[3], ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4]), false, 0)})
