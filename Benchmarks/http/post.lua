-- POST /tasks with a ~150-byte JSON submission.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"kind":"sleep","params":{"duration_ms":1500,"steps":10},"queue":"default","priority":2,"name":"resize-images","dependencies":["01JD3V8Q4W6F6M2K9T7B5R3N1A"]}'
