-- wrk: a worker's cycle, leasing from 64 queues in turn (`bench0` ... `bench63`): lease one
-- task, then complete it with its lease token. Requests/sec counts both calls: cycles are half.
local id, token
local next = 0
local headers = { ["Content-Type"] = "application/json" }

request = function()
    if id then
        local path = "/tasks/" .. id .. "/complete"
        local body = '{"lease_token":"' .. token .. '"}'
        id = nil
        return wrk.format("POST", path, headers, body)
    end
    next = (next + 1) % 64
    return wrk.format("POST", "/queues/bench" .. next .. "/lease", headers, '{"worker":"bench"}')
end

response = function(status, headers, body)
    if status == 200 and body:sub(1, 10) == '{"tasks":[' and body:sub(11, 11) == "{" then
        id = body:match('"id":"([^"]+)"')
        token = body:match('"token":"([^"]+)"')
    elseif status ~= 200 then
        print("unexpected answer " .. status .. ": " .. body)
    end
end
