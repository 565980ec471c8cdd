#!/usr/bin/env python3
"""An origin for the outbound address policy tests, run inside the test's own network
namespace: it listens on port 80 of every address given on the command line and answers
every request 200 `ok`, except `/redirect-to/<absolute URL>`, a 302 there.

It prints `listening` once every address listens, then one JSON line per request:
{"address", "method", "path", "headers"} (header names lower-cased). It exits when its stdin
closes, so it never outlives the test that started it.
"""
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        seen = {
            "address": self.server.server_address[0],
            "method": self.command,
            "path": self.path,
            "headers": {name.lower(): value for name, value in self.headers.items()},
        }
        with lock:
            print(json.dumps(seen), flush=True)
        if self.path.startswith("/redirect-to/"):
            self.send_response(302)
            self.send_header("Location", self.path[len("/redirect-to/"):])
            body = b""
        else:
            self.send_response(200)
            body = b"ok"
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = answer


class IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


for address in sys.argv[1:]:
    server = (IPv6Server if ":" in address else ThreadingHTTPServer)((address, 80), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
print("listening", flush=True)
sys.stdin.read()
