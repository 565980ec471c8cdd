"""A server from before POST /tasks/reports, for the worker's tests: it forwards every request
to the taskloop server on 127.0.0.1 at the port given, except POST /tasks/reports, which it
answers 404 as a server without the route does, printing `refused /tasks/reports` each time.
Prints `listening on PORT` first; exits when its stdin closes."""
import http.client
import http.server
import sys
import threading

TARGET = int(sys.argv[1])
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}
NOT_FOUND = (b'{"type":"about:blank","title":"Not Found","status":404,'
             b'"detail":"No route for POST /tasks/reports.","code":"not_found"}')


class Forwarder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, headers, body):
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def forward(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if self.command == "POST" and self.path.split("?")[0] == "/tasks/reports":
            print("refused /tasks/reports", flush=True)
            return self.answer(404, [("Content-Type", "application/problem+json")], NOT_FOUND)
        upstream = http.client.HTTPConnection("127.0.0.1", TARGET, timeout=120)
        headers = {name: value for name, value in self.headers.items() if name.lower() not in HOP_BY_HOP}
        upstream.request(self.command, self.path, body, headers)
        reply = upstream.getresponse()
        data = reply.read()
        upstream.close()
        self.answer(reply.status, reply.getheaders(), data)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = forward

    def log_message(self, *arguments):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forwarder)
server.daemon_threads = True
print(f"listening on {server.server_address[1]}", flush=True)
threading.Thread(target=server.serve_forever, daemon=True).start()
sys.stdin.read()
