-- Shared by the episode scripts (prepended to each one): the snapshot and the ending.
-- An episode is a hash of strings; absent fields are None. Times are Python float reprs,
-- copied as given, so they round-trip exactly. Each script answers with one JSON array,
-- the cheapest reply for the client to parse.

local function snapshot(ep)
  return redis.call('HGETALL', ep)
end

-- core.episode.finish after the report's fields are written: end reason by precedence
-- success > exhausted > failure > abandoned; keep the episode for retention, then its id.
local function end_episode(ep, gone, now, retention_ms, remember_ms)
  local f = redis.call('HMGET', ep, 'outcome', 'refused', 'turns_used', 'budget')
  local reason = 'abandoned'
  if f[1] == 'success' then
    reason = 'success'
  elseif f[2] == '1' or tonumber(f[3]) >= tonumber(f[4]) then
    reason = 'exhausted'
  elseif f[1] == 'failure' then
    reason = 'failure'
  end
  redis.call('HSET', ep, 'status', 'finished', 'ended_at', now, 'end_reason', reason)
  local snap = snapshot(ep)
  redis.call('PEXPIRE', ep, math.max(1, retention_ms))
  redis.call('SET', gone, now, 'PX', math.max(1, retention_ms + remember_ms))
  return snap
end
