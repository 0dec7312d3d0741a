-- Keep an answered turn for GET /v1/episodes/{id}/trajectory (store/turn_log.py).
-- KEYS: the episode's turn list, its byte count. ARGV: entry, most entries kept, ttl s,
-- most bytes kept. Returns 0, or the entry's position (1-based) when the episode is past
-- its byte bound: the caller swaps it for its form without messages.
local n = redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[2]) - 1)
redis.call('EXPIRE', KEYS[1], ARGV[3])
local size = redis.call('INCRBY', KEYS[2], #ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[3])
if size > tonumber(ARGV[4]) and n <= tonumber(ARGV[2]) then
  return n
end
return 0
