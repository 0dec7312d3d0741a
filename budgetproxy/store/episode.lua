-- Shared by the episode scripts (prepended to each one): the snapshot and the ending.
-- An episode is a hash of strings; absent fields are None. Times are Python float reprs,
-- copied as given, so they round-trip exactly. Each script answers with one JSON array,
-- the cheapest reply for the client to parse.

local function snapshot(ep)
  return redis.call('HGETALL', ep)
end

-- core.episode.end_reason: success > exhausted > failure > abandoned.
local function reason_of(ep)
  local f = redis.call('HMGET', ep, 'outcome', 'refused', 'turns_used', 'budget', 'exhausted_by')
  if f[1] == 'success' then
    return 'success'
  elseif f[2] == '1' or tonumber(f[3]) >= tonumber(f[4]) or f[5] then
    return 'exhausted'
  elseif f[1] == 'failure' then
    return 'failure'
  end
  return 'abandoned'
end

-- core.episode.finish after the report's fields are written; keep the episode for
-- retention, then its id; its disclosure placements (`pl`) go: no turn of it is opened
-- again. `pending`: turns are in flight, and their settling completes the ending (core
-- end_pending).
local function end_episode(ep, gone, pl, now, retention_ms, remember_ms, pending,
                           pending_ttl_ms)
  redis.call('HSET', ep, 'status', 'finished', 'ended_at', now, 'end_reason', reason_of(ep),
    'end_pending', pending and '1' or '0')
  redis.call('HDEL', ep, 'placements')  -- (an older version's)
  local snap = snapshot(ep)
  -- an ending that waits for turns in flight keeps the episode as long as an active one: its
  -- record is written when they settle, which retention alone (possibly 0) would not wait for
  local keep_ms = retention_ms
  if pending then
    keep_ms = math.max(retention_ms, pending_ttl_ms)
  end
  redis.call('PEXPIRE', ep, math.max(1, keep_ms))
  redis.call('SET', gone, now, 'PX', math.max(1, retention_ms + remember_ms))
  redis.call('DEL', pl)
  return snap
end
