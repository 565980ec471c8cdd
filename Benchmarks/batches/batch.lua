-- wrk: POST /tasks/batch of 1,000 noops of queue `bench` on every request. Tasks/s is
-- requests/s times 1,000. Any item that is not 201 is reported (the benchmark then fails).
local items = {}
for i = 1, 1000 do items[i] = '{"kind":"noop","queue":"bench"}' end
wrk.method = "POST"
wrk.path = "/tasks/batch"
wrk.body = '{"tasks":[' .. table.concat(items, ",") .. ']}'
wrk.headers["Content-Type"] = "application/json"

response = function(status, headers, body)
    if status ~= 207 or body:find('"status":4') or body:find('"status":5') then
        print("unexpected answer " .. status .. ": " .. body:sub(1, 300))
    end
end
