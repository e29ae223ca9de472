-- budget: store the dispatcher's budget states (hash <prefix>budget: tenant -> JSON of
-- fairshare.queue.budget.BudgetStatus). ARGV: per tenant with a budget, 3 fields: name,
-- JSON, state. Tenants not named lose their entry (their budget was removed).
-- Returns a flat list of 3 fields per tenant whose state changed: name, state before
-- ('' when it had none), state after ('' when its entry was removed).
local key = P .. 'budget'
local function state_of(json)
  local ok, status = pcall(cjson.decode, json)
  return ok and type(status) == 'table' and status.state or ''
end
local out = {}
local named = {}
for i = 1, #ARGV, 3 do
  local tenant, json, state = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  named[tenant] = true
  local old = redis.call('HGET', key, tenant)
  local before = old and state_of(old) or ''
  redis.call('HSET', key, tenant, json)
  if before ~= state then
    out[#out + 1] = tenant
    out[#out + 1] = before
    out[#out + 1] = state
  end
end
for _, tenant in ipairs(redis.call('HKEYS', key)) do
  if not named[tenant] then
    local old = redis.call('HGET', key, tenant)
    redis.call('HDEL', key, tenant)
    out[#out + 1] = tenant
    out[#out + 1] = state_of(old)
    out[#out + 1] = ''
  end
end
return out
