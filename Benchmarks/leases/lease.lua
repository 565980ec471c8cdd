-- wrk: a worker's cycle on each connection: lease one task of queue `bench`, then complete it
-- with its lease token. Requests/sec counts both calls: cycles are half. A wrk thread's
-- connections share this script's state, so each leased task waits in a list for the thread's
-- next request (with one variable, a second lease's answer could replace the first's before
-- it was completed, and that task stayed leased).
local leased = {}
local headers = { ["Content-Type"] = "application/json" }

request = function()
    local task = table.remove(leased, 1)
    if task then
        return wrk.format("POST", "/tasks/" .. task.id .. "/complete", headers, '{"lease_token":"' .. task.token .. '"}')
    end
    return wrk.format("POST", "/queues/bench/lease", headers, '{"worker":"bench"}')
end

response = function(status, headers, body)
    if status == 200 and body:sub(1, 10) == '{"tasks":[' and body:sub(11, 11) == "{" then
        table.insert(leased, { id = body:match('"id":"([^"]+)"'), token = body:match('"token":"([^"]+)"') })
    elseif status ~= 200 then
        print("unexpected answer " .. status .. ": " .. body)
    end
end
