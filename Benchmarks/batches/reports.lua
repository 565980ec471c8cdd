-- wrk: a worker's cycle on each connection: lease 100 tasks of queue `bench`, then finish them
-- all with one POST /tasks/reports. Requests/sec counts both calls: tasks/s is half of it times
-- 100 while the queue holds enough. As in Benchmarks/leases/lease.lua, a thread's leased batches
-- wait in a list for its next request.
local leased = {}
local headers = { ["Content-Type"] = "application/json" }

request = function()
    local reports = table.remove(leased, 1)
    if reports then
        return wrk.format("POST", "/tasks/reports", headers, '{"reports":[' .. reports .. ']}')
    end
    return wrk.format("POST", "/queues/bench/lease", headers, '{"worker":"bench","max_tasks":100}')
end

response = function(status, headers, body)
    if status == 200 and body:sub(1, 10) == '{"tasks":[' then
        local items = {}
        for id, token in body:gmatch('"id":"([^"]+)".-"token":"([^"]+)"') do
            items[#items + 1] = '{"id":"' .. id .. '","lease_token":"' .. token .. '","complete":{}}'
        end
        if #items < 100 then print("short lease: " .. #items .. " tasks") end
        if #items > 0 then table.insert(leased, table.concat(items, ",")) end
    elseif status == 207 then
        if body:find('"status":4') or body:find('"status":5') then print("unexpected answer: " .. body:sub(1, 300)) end
    else
        print("unexpected answer " .. status .. ": " .. body:sub(1, 300))
    end
end
