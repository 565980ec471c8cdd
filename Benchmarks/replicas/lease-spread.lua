-- wrk: workers' cycles, leasing from 64 queues in turn (`bench0` ... `bench63`): lease one
-- task, then complete it with its lease token. Requests/sec counts both calls: cycles are half.
-- A wrk thread's connections share this script's state, so each leased task waits in a list
-- for the thread's next request (one variable let a second lease's answer replace the first's
-- before it was completed: that task stayed leased, and the queues filled up with them).
local leased = {}
local next = 0
local headers = { ["Content-Type"] = "application/json" }

request = function()
    local task = table.remove(leased, 1)
    if task then
        return wrk.format("POST", "/tasks/" .. task.id .. "/complete", headers, '{"lease_token":"' .. task.token .. '"}')
    end
    next = (next + 1) % 64
    return wrk.format("POST", "/queues/bench" .. next .. "/lease", headers, '{"worker":"bench"}')
end

response = function(status, headers, body)
    if status == 200 and body:sub(1, 10) == '{"tasks":[' and body:sub(11, 11) == "{" then
        table.insert(leased, { id = body:match('"id":"([^"]+)"'), token = body:match('"token":"([^"]+)"') })
    elseif status ~= 200 then
        print("unexpected answer " .. status .. ": " .. body)
    end
end
