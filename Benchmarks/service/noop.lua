-- wrk: submit a noop task on every request.
wrk.method = "POST"
wrk.body = '{"kind":"noop"}'
wrk.headers["Content-Type"] = "application/json"
