-- End an episode (core finish): the first call ends it; later ones get its snapshot back.
-- KEYS: episode, remembered id, placements. ARGV: now, has_report (0|1), success (0|1),
-- reward JSON ('' for none), success_turn ('' for none), metadata JSON, retention ms,
-- remember ms, active ttl ms (how long an ending waiting for turns in flight is kept).
local ep, gone = KEYS[1], KEYS[2]
local status = redis.call('HGET', ep, 'status')
if not status then
  return false
end
if status == 'finished' then
  return cjson.encode({'ended', snapshot(ep)})
end
if ARGV[2] == '1' then
  if ARGV[3] == '1' then
    local turn = ARGV[5]
    if turn == '' then
      turn = redis.call('HGET', ep, 'turns_used')
    end
    redis.call('HSET', ep, 'outcome', 'success', 'success_turn', turn)
  else
    redis.call('HSET', ep, 'outcome', 'failure')
  end
  if ARGV[4] == '' then
    redis.call('HDEL', ep, 'reward')
  else
    redis.call('HSET', ep, 'reward', ARGV[4])
  end
  redis.call('HSET', ep, 'metadata', ARGV[6])
end
local pending = tonumber(redis.call('HGET', ep, 'inflight')) > 0
return cjson.encode({'finished',
  end_episode(ep, gone, KEYS[3], ARGV[1], tonumber(ARGV[7]), tonumber(ARGV[8]), pending,
    tonumber(ARGV[9]))})
