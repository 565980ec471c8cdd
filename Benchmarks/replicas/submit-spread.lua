-- wrk: submit a noop task on every request, to 64 queues in turn (`bench0` ... `bench63`):
-- with cells, the queues spread over the cells, hence over the replicas.
local next = 0
local headers = { ["Content-Type"] = "application/json" }

request = function()
    next = (next + 1) % 64
    return wrk.format("POST", "/tasks", headers, '{"kind":"noop","queue":"bench' .. next .. '"}')
end
