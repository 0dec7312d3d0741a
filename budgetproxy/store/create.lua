-- Create an episode unless its id is live or remembered. KEYS: episode, remembered id.
-- ARGV: active ttl ms, field, value, ...
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
