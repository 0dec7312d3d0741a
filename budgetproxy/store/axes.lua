-- Budgets beside turns (core.axes), prepended to the turn scripts: the same rules, the same
-- float arithmetic (Lua numbers are doubles, as Python floats), stored with '%.17g' so they
-- round-trip exactly.

local function num(s)
  return s and tonumber(s) or nil
end

local function g17(x)
  return string.format('%.17g', x)
end

-- core.axes.plan: a hold {cap, tokens, cost, deadline}, or {spent = axis}, or {need_price},
-- or {held} (what is left is held by calls in flight).
-- client_cap and out_rate are '' when none; budgets as HMGET gives them.
local function axes_plan(ep, now, client_cap, out_rate, output_hold, tb, cb, timeb)
  local a = redis.call('HMGET', ep, 'tokens_used', 'tokens_reserved', 'cost_used',
    'cost_reserved', 'first_call_at')
  local deadline = nil
  if timeb then
    deadline = (num(a[5]) or now) + tonumber(timeb)
    if now >= deadline then
      return {spent = 'time'}
    end
  end
  local client = num(client_cap)
  local cap = client
  if tb then
    local used = tonumber(a[1] or '0')
    local left = tonumber(tb) - used - tonumber(a[2] or '0')
    if left < 1 then
      if used >= tonumber(tb) then
        return {spent = 'tokens'}
      end
      return {held = true}
    end
    cap = cap and math.min(cap, left) or left
  end
  local cost = 0
  if cb then
    local rate = num(out_rate)
    if not rate then
      return {need_price = true}
    end
    local unheld = tonumber(cb) - tonumber(a[3] or '0')
    local left_cost = unheld - tonumber(a[4] or '0')
    if left_cost <= 1e-12 or (rate > 0 and math.floor(left_cost / rate + 1e-9) < 1) then
      if unheld <= 1e-12 or (rate > 0 and math.floor(unheld / rate + 1e-9) < 1) then
        return {spent = 'cost'}
      end
      return {held = true}
    end
    if rate > 0 then
      local affordable = math.floor(left_cost / rate + 1e-9)
      cap = cap and math.min(cap, affordable) or affordable
      cost = cap * rate
    end
  end
  if (tb or cb) and not client and cap and cap > output_hold then
    -- plenty left: no cap added, the usual most a call writes held
    return {cap = nil, tokens = output_hold, cost = cost * output_hold / cap,
      deadline = deadline}
  end
  local tokens = 0
  if cap and (tb or cb) then
    tokens = cap
  end
  if cap == client then
    cap = nil
  end
  return {cap = cap, tokens = tokens, cost = cost, deadline = deadline}
end

-- core.axes.apply: hold the reservation; the hold as the JSON the client reads.
local function axes_apply(ep, hold, now_raw)
  redis.call('HSETNX', ep, 'first_call_at', now_raw)
  if hold.tokens > 0 then
    redis.call('HINCRBY', ep, 'tokens_reserved', hold.tokens)
  end
  if hold.cost > 0 then
    local cr = tonumber(redis.call('HGET', ep, 'cost_reserved') or '0')
    redis.call('HSET', ep, 'cost_reserved', g17(cr + hold.cost))
  end
  return string.format('[%s,%d,%s,%s]', hold.cap and string.format('%d', hold.cap) or 'null',
    hold.tokens, g17(hold.cost), hold.deadline and g17(hold.deadline) or 'null')
end

-- core.axes.settle. ARGV from `first` on: held tokens, held cost, spent tokens ('' none
-- reported), spent cost ('' unpriced), timed out (0|1).
local function axes_settle(ep, refundable, first)
  local ht, hc = tonumber(ARGV[first]), tonumber(ARGV[first + 1])
  local a = redis.call('HMGET', ep, 'token_budget', 'cost_budget', 'tokens_used', 'cost_used',
    'tokens_reserved', 'cost_reserved', 'exhausted_by')
  local tr = math.max(0, tonumber(a[5] or '0') - ht)
  local cr = math.max(0, tonumber(a[6] or '0') - hc)
  local t, c = 0, 0
  if not refundable then
    if ARGV[first + 2] == '' then
      t, c = ht, hc
    else
      t, c = tonumber(ARGV[first + 2]), num(ARGV[first + 3]) or 0
    end
  end
  local tu = tonumber(a[3] or '0') + t
  local cu = tonumber(a[4] or '0') + c
  local fields = {'tokens_reserved', string.format('%d', tr), 'cost_reserved', g17(cr),
    'tokens_used', string.format('%d', tu), 'cost_used', g17(cu)}
  if not a[7] then
    local by = nil
    if a[1] and tu >= tonumber(a[1]) then
      by = 'tokens'
    elseif a[2] and cu >= tonumber(a[2]) - 1e-12 then
      by = 'cost'
    elseif ARGV[first + 4] == '1' then
      by = 'time'
    end
    if by then
      fields[#fields + 1] = 'exhausted_by'
      fields[#fields + 1] = by
    end
  end
  redis.call('HSET', ep, unpack(fields))
end
