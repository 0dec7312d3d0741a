-- wrk script: POST chat completion requests, each body distinct (a turn counter in the last
-- message, so a proxy never sees byte-identical resends), optionally tagged with one of N
-- episode ids, and a machine-readable summary line at the end.
--
--   wrk -t1 -c32 -d5s --latency -s bench/wrk_chat.lua URL -- EPISODES [BUDGET]
-- BENCH_AUTH in the environment adds "Authorization: Bearer $BENCH_AUTH"; BENCH_HEADERS
-- ("Name: value; Name: value") adds further headers.
-- BENCH_API=responses|messages sends the same turn as a Responses or Anthropic Messages body
-- (to /v1/responses or /v1/messages: the URL is the caller's).
-- BENCH_HISTORY_KB=N puts about N KB of earlier turns (1 KB messages, assistant and user in
-- turn) before the last message, as a long agent conversation has: costs that follow the
-- body's size (parsing, hashing, logging) then show.
-- BENCH_BODY_FIELDS='"name":value,...' adds those members at the start of every body.

local episodes = 0
local budget = "1000000000"
local counter = 0
local headers = {}
local prefix = '{"model":"fake-model","temperature":0,"max_tokens":64,"messages":['
  .. '{"role":"system","content":"You are a careful agent working on a grid puzzle. '
  .. 'Think briefly, then answer with exactly one move: left, right, up or down."},'
  .. '{"role":"user","content":"Observation: you stand on a frozen tile; the goal lies '
  .. 'south-east; holes are marked H on the map SFFF FHFH FFFH HFFG. Step '
local suffix = ': choose your next move."}]}'

local system = 'You are a careful agent working on a grid puzzle. '
  .. 'Think briefly, then answer with exactly one move: left, right, up or down.'
local observation = 'Observation: you stand on a frozen tile; the goal lies '
  .. 'south-east; holes are marked H on the map SFFF FHFH FFFH HFFG. Step '
local bodies = {
  responses = {'{"model":"fake-model","max_output_tokens":64,"instructions":"' .. system
    .. '","input":[{"role":"user","content":"' .. observation, suffix},
  messages = {'{"model":"fake-model","max_tokens":64,"system":"' .. system
    .. '","messages":[{"role":"user","content":"' .. observation, suffix},
}

function init(args)
  local api = os.getenv("BENCH_API")
  if api and bodies[api] then
    prefix, suffix = bodies[api][1], bodies[api][2]
  end
  episodes = tonumber(args[1] or "0") or 0
  budget = args[2] or budget
  headers["Content-Type"] = "application/json"
  local auth = os.getenv("BENCH_AUTH")
  if auth and auth ~= "" then
    headers["Authorization"] = "Bearer " .. auth
  end
  for name, value in string.gmatch(os.getenv("BENCH_HEADERS") or "", "([^:;]+):%s*([^;]+)") do
    headers[name:gsub("^%s+", "")] = value
  end
  if episodes > 0 then
    headers["X-Episode-Budget"] = budget
  end
  local fields = os.getenv("BENCH_BODY_FIELDS") or ""
  if fields ~= "" then
    prefix = "{" .. fields .. "," .. prefix:sub(2)
  end
  local history = tonumber(os.getenv("BENCH_HISTORY_KB") or "0") or 0
  if history > 0 then
    local turns = {}
    local filler = string.rep("The agent moved and observed the grid; nothing changed. ", 17)
    for i = 1, history do
      local role = (i % 2 == 1) and "assistant" or "user"
      turns[#turns + 1] = '{"role":"' .. role .. '","content":"' .. i .. ": " .. filler .. '"},'
    end
    local cut = prefix:find('{"role":"user"', 1, true)
    prefix = prefix:sub(1, cut - 1) .. table.concat(turns) .. prefix:sub(cut)
  end
end

function request()
  counter = counter + 1
  if episodes > 0 then
    headers["X-Episode-Id"] = "bench-" .. (counter % episodes)
  end
  return wrk.format("POST", nil, headers, prefix .. counter .. suffix)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"mean":%.1f,"max":%d,"p50":%d,"p90":%d,"p99":%d,"p999":%d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency.max, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9)))
end
