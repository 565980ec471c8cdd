-- wrk: a worker's cycle on each connection (one per thread): lease one task of queue `bench`,
-- then complete it with its lease token. Requests/sec counts both calls: cycles are half.
local id, token
local headers = { ["Content-Type"] = "application/json" }

request = function()
    if id then
        local path = "/tasks/" .. id .. "/complete"
        local body = '{"lease_token":"' .. token .. '"}'
        id = nil
        return wrk.format("POST", path, headers, body)
    end
    return wrk.format("POST", "/queues/bench/lease", headers, '{"worker":"bench"}')
end

response = function(status, headers, body)
    if status == 200 and body:sub(1, 10) == '{"tasks":[' and body:sub(11, 11) == "{" then
        id = body:match('"id":"([^"]+)"')
        token = body:match('"token":"([^"]+)"')
    elseif status ~= 200 then
        print("unexpected answer " .. status .. ": " .. body)
    end
end
