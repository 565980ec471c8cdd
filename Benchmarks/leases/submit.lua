-- wrk: submit a noop task to queue `bench` on every request (the reference for lease cycles).
wrk.method = "POST"
wrk.path = "/tasks"
wrk.body = '{"kind":"noop","queue":"bench"}'
wrk.headers["Content-Type"] = "application/json"
