-- Keep an answered turn for GET /v1/episodes/{id}/trajectory (store/turn_log.py).
-- KEYS: the episode's turn list, its byte count, its tip (the last entry kept with its
-- messages, "turn:attempt"). ARGV: entry, most entries kept, ttl s, most bytes kept, the
-- entry's "turn:attempt", and the tip it follows ("" when it is whole).
-- Returns -1 when the entry follows a tip that is not the list's (a write lost, or another
-- replica's turn in between: nothing is written, and the caller sends it whole); else 0, or
-- the entry's position (1-based) when the episode is past its byte bound: the caller swaps
-- it for its form without messages.
if ARGV[6] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[6] then
  return -1
end
local n = redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[2]) - 1)
redis.call('EXPIRE', KEYS[1], ARGV[3])
local size = redis.call('INCRBY', KEYS[2], #ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[3])
if n > tonumber(ARGV[2]) then
  redis.call('DEL', KEYS[3])  -- (not kept: nothing can follow it)
  return 0
end
if size > tonumber(ARGV[4]) then
  redis.call('DEL', KEYS[3])  -- (kept without its messages)
  return n
end
redis.call('SET', KEYS[3], ARGV[5], 'EX', ARGV[3])
return 0
