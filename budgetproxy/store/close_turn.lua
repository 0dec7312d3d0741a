-- Close a forwarded turn: core settle. Returns nil for an unknown episode; 1 or 0 (refunded)
-- for a turn-only call that did not end its episode; else [refunded, snapshot, ended].
-- KEYS: episode, its placements. ARGV: grant turn, grant charged (0|1), grant body hash,
-- result (ok|refundable|broken), now, count_failed (0|1), active ttl ms, retention ms,
-- and for a call holding other axes (core.axes) the five axes_settle arguments.
local ep = KEYS[1]
local f = redis.call('HMGET', ep, 'status', 'inflight', 'turns_used', 'last_turn', 'last_hash',
  'last_state', 'end_pending')
if not f[1] then
  return false
end
local charged = ARGV[2] == '1'
local used = tonumber(f[3])
local state = f[6]
local pending = f[7] == '1'
local inflight = math.max(0, tonumber(f[2]) - 1)
local refund = ARGV[4] == 'refundable' and charged and ARGV[6] == '0'
-- a recorded episode keeps the numbers it was recorded with
if refund and (f[1] == 'active' or pending) then
  used = math.max(0, used - 1)
end
if tonumber(ARGV[1]) == tonumber(f[4]) and ARGV[3] == f[5] then
  if refund then
    state = 'refunded'
  elseif charged or state == 'inflight' then
    state = 'charged'
  end
end
redis.call('HSET', ep, 'inflight', inflight, 'last_activity', ARGV[5],
  'turns_used', used, 'last_state', state)
if #ARGV >= 13 and (f[1] == 'active' or pending) then
  axes_settle(ep, ARGV[4] == 'refundable', 9)
end
if f[1] == 'active' or pending then
  redis.call('PEXPIRE', ep, ARGV[7])
  if KEYS[2] then  -- (kept as long as the episode: nothing if it has none)
    redis.call('PEXPIRE', KEYS[2], ARGV[7])
  end
end
local ended = 0
if pending then
  -- ended while this turn was in flight: the end reason follows the settled numbers, and
  -- the last turn to settle hands the ending back to be recorded
  redis.call('HSET', ep, 'end_reason', reason_of(ep))
  if inflight == 0 then
    redis.call('HSET', ep, 'end_pending', '0')
    redis.call('PEXPIRE', ep, math.max(1, tonumber(ARGV[8])))  -- recorded: now retention
    ended = 1
  end
end
if #ARGV >= 13 or ended == 1 then
  return cjson.encode({refund and 1 or 0, snapshot(ep), ended})
end
-- a turn-only call's caller needs no snapshot: the refund alone
return refund and 1 or 0
