-- Open a turn: create the episode if absent (ARGV[16..] are its fields), then core reserve.
-- KEYS: episode, remembered id, placements. ARGV: body_hash, now, free_retries,
-- message_count, disclosure_index ('' for none), active ttl ms, model ('' for none),
-- fingerprint ('' for none), client output cap ('' none), USD per output token ('' unknown),
-- output tokens held for a call with no cap (core.axes.OUTPUT_HOLD), '1' when the caller
-- keeps the episode's fixed fields (a forwarded turn of a turn-only episode is then answered
-- with what the turn changed, not the whole episode), the placements the caller holds an
-- answer for: their number and the newest one's digest ('' '' for none; core.episode.Known),
-- the caller's deadline in this server's clock (ms, '' for none), [field, value, ...].

-- core.episode.place on the list of placements (JSON texts [index, turn, count, digest]), in
-- work that does not grow with it: drop from its end those of longer conversations, and the
-- one at this index among those with at least `index` messages, then append.
local function place(pl, index, turn, count, digest)
  local tail = redis.call('LINDEX', pl, -1)
  while tail and cjson.decode(tail)[3] > count do
    redis.call('RPOP', pl)
    tail = redis.call('LINDEX', pl, -1)
  end
  local at = -1
  while tail do
    local p = cjson.decode(tail)
    if p[3] < index then
      break
    elseif p[1] == index then
      redis.call('LREM', pl, -1, tail)  -- (one, looked for from the end: it is unique)
      break
    end
    at = at - 1
    tail = redis.call('LINDEX', pl, at)
  end
  redis.call('RPUSH', pl, string.format('[%d,%d,%d,%s]', index, turn, count,
    cjson.encode(digest)))
end

local ep, gone, pl = KEYS[1], KEYS[2], KEYS[3]
-- A call whose caller has given up waiting (ARGV[15]: its deadline in this server's clock, in
-- ms; '' for none) takes no turn: the caller answered it 503 (Redis stalled past its socket
-- timeout, and the script ran once Redis woke), and a turn reserved now would stay in flight.
if ARGV[15] ~= '' then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[15]) then
    return cjson.encode({'late'})
  end
end
local body_hash, now = ARGV[1], ARGV[2]
local free_retries = tonumber(ARGV[3])
local index = ARGV[5]
local created = 0
if redis.call('EXISTS', ep) == 0 then
  if redis.call('EXISTS', gone) == 1 then
    return cjson.encode({'gone'})
  end
  if #ARGV < 16 then
    return cjson.encode({'absent'})
  end
  redis.call('HSET', ep, unpack(ARGV, 16))
  redis.call('PEXPIRE', ep, ARGV[6])  -- (a first call refused below leaves it its TTL too)
  created = 1
end
local f = redis.call('HMGET', ep, 'status', 'budget', 'turns_used', 'inflight', 'last_turn',
  'last_attempt', 'last_hash', 'last_state', 'free_retries_used', 'placements',
  'messages_seen', 'messages_digest', 'disclosure', 'token_budget', 'cost_budget',
  'time_budget_s', 'model', 'refused')
if f[1] == 'finished' then
  return cjson.encode({'finished', created, snapshot(ep)})
end
local hold = nil
if f[14] or f[15] or f[16] then
  hold = axes_plan(ep, tonumber(ARGV[2]), ARGV[9], ARGV[10], tonumber(ARGV[11]), f[14], f[15],
    f[16])
  if hold.need_price then
    return cjson.encode({'need_price', created, snapshot(ep)})
  elseif hold.held then
    return cjson.encode({'held', created, snapshot(ep)})
  elseif hold.spent then
    redis.call('HSET', ep, 'refused', '1')
    redis.call('HSETNX', ep, 'exhausted_by', hold.spent)
    return cjson.encode({'exhausted', created, snapshot(ep)})
  end
end
local budget, used, inflight = tonumber(f[2]), tonumber(f[3]), tonumber(f[4])
local last_turn, attempt, last_hash, last_state = tonumber(f[5]), tonumber(f[6]), f[7], f[8]
local free_used, seen, seen_digest = tonumber(f[9]), f[11], f[12]
local count, fingerprint = tonumber(ARGV[4]), ARGV[8]
local is_retry = last_hash == body_hash and (last_state == 'charged' or last_state == 'refunded')
local charged
if is_retry and last_state == 'charged' and free_used < free_retries then
  -- a free resend of a charged turn
  free_used = free_used + 1
  attempt = attempt + 1
  charged = 0
else
  if used >= budget then
    redis.call('HSET', ep, 'refused', '1')
    return cjson.encode({'exhausted', created, snapshot(ep)})
  end
  used = used + 1
  if is_retry and last_state == 'refunded' then
    -- a resend of a refunded turn is charged as that turn
    attempt = attempt + 1
  else
    last_turn = used
    attempt = 1
    free_used = 0
    last_hash = body_hash
  end
  charged = 1
end
local fields = {'turns_used', used, 'last_turn', last_turn, 'last_attempt', attempt,
  'free_retries_used', free_used, 'last_hash', last_hash, 'last_state', 'inflight',
  'last_charged', charged, 'inflight', inflight + 1, 'last_activity', now,
  'messages_seen', ARGV[4]}
if f[10] then
  -- placements an older version kept in the hash (or an episode created with some): into
  -- the list, as if placed one by one
  for _, p in ipairs(cjson.decode(f[10])) do
    if #p == 4 then
      place(pl, p[1], p[2], p[3], p[4])
    end
  end
  redis.call('HDEL', ep, 'placements')
end
-- The earlier placements (core.episode.placements_of): the newest alone when they are as
-- the caller's answer covers, else all of them.
local placed_n = redis.call('LLEN', pl)
local newest, every = false, '[]'
if placed_n > 0 then
  newest = redis.call('LINDEX', pl, -1)
  if ARGV[13] ~= '' and tonumber(ARGV[13]) == placed_n and cjson.decode(newest)[4] == ARGV[14]
  then
    every = false
  else
    every = '[' .. table.concat(redis.call('LRANGE', pl, 0, -1), ',') .. ']'
  end
end
local placed = false
if index ~= '' and f[13] == 'disclosed' then
  place(pl, tonumber(index), last_turn, count, fingerprint)
  placed = true
end
redis.call('HSET', ep, unpack(fields))
if fingerprint == '' then
  redis.call('HDEL', ep, 'messages_digest')
else
  redis.call('HSET', ep, 'messages_digest', fingerprint)
end
if ARGV[7] ~= '' then
  -- the first forwarded turn's model becomes the episode's (API-created episodes have none)
  redis.call('HSETNX', ep, 'model', ARGV[7])
end
local held = ''
if hold then
  held = axes_apply(ep, hold, ARGV[2])
end
redis.call('PEXPIRE', ep, ARGV[6])
if placed or placed_n > 0 then
  redis.call('PEXPIRE', pl, ARGV[6])
end
local prior = {placed_n, newest, every}
if ARGV[12] == '1' and created == 0 and not hold then
  -- The caller knows what never changes (its last full reply): the turn's changes alone,
  -- [turns_used, inflight, free retries used, last hash, model, refused].
  local model = f[17]
  if not model and ARGV[7] ~= '' then
    model = ARGV[7]
  end
  return cjson.encode({'forward', created, false, last_turn, attempt, charged, prior, seen,
    seen_digest or false, held, {used, inflight + 1, free_used, last_hash, model or false,
    f[18] or '0'}})
end
return cjson.encode({'forward', created, snapshot(ep), last_turn, attempt, charged, prior,
  seen, seen_digest, held})
