-- wrk script of bench/service/run: POST /orders, each request a new
-- order with an Idempotency-Key never used before.
--
--   wrk -t2 -c16 -d6s -s orders.lua http://HOST:PORT -- RUN_ID
--
-- RUN_ID (any word, different for every round) makes the keys unique
-- across rounds and runs; within a round each thread numbers its keys.
-- X-User-ID is one of 1000 users, the sku one of the 100 products
-- SKU-100 … SKU-199 (bench/service/run seeds them with stock that never
-- runs out), quantity 1. done() prints one machine-readable line,
--
--   RESULT requests=N seconds=S rps=R p50_ms=A p99_ms=B non2xx=C errors=E
--
-- which the runner parses: non2xx is wrk's count of answers with a status
-- of 400 or more (shopd answers a new order 201 and never redirects it;
-- a response() hook that checked each status would cost wrk, which shares
-- the machine, Lua work per request: the runner checks instead that every
-- request left an order and a completed record), errors are connect,
-- read, write and timeout errors.

local threads = {}
local counter = 0
local run = "run"

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  if args[1] then run = args[1] end
  math.randomseed(os.time() * 1000 + tid)
end

function request()
  counter = counter + 1
  local user = math.random(1, 1000)
  local sku = math.random(100, 199)
  return wrk.format("POST", "/orders", {
    ["Idempotency-Key"] = run .. "-" .. tid .. "-" .. counter,
    ["X-User-ID"] = tostring(user),
    ["Content-Type"] = "application/json",
  }, '{"sku":"SKU-' .. sku .. '","quantity":1}')
end

function done(summary, latency, requests)
  local e = summary.errors
  local secs = summary.duration / 1e6
  io.write(string.format(
    "RESULT requests=%d seconds=%.3f rps=%.1f p50_ms=%.3f p99_ms=%.3f non2xx=%d errors=%d\n",
    summary.requests, secs, summary.requests / secs,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    e.status, e.connect + e.read + e.write + e.timeout))
end
