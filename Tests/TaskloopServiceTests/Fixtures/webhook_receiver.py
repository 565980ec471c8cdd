#!/usr/bin/env python3
"""A webhook receiver for the tests, independent of the server's code: it checks each
delivery's Standard Webhooks 1.0 signature with Python's own hmac and base64.

It listens on 127.0.0.1 (port 0 unless given) and prints `listening on PORT`, then one JSON
line per delivery: {"path", "id", "timestamp", "verified", "answered", "body"}. A second argument,
the control body below as JSON, is applied before it listens: no delivery can arrive before it.

Control: POST /control {"secret": "whsec_...", "answers": {"/hook": [500, 500, 200]}} sets the
secret deliveries are checked against and, per path, the statuses answered in turn (the last one
repeats; 0 means never answer, holding the request until the receiver stops; a path not named
gets 200). Everything else is a delivery.
"""
import base64
import hashlib
import hmac
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

state = {"secret": None, "answers": {}}
lock = threading.Lock()
stopping = threading.Event()


def verify(secret, headers, body):
    """True when one of the v1 signatures matches and the timestamp is within five minutes."""
    if not secret or not secret.startswith("whsec_"):
        return False
    key = base64.b64decode(secret[len("whsec_"):], validate=True)
    message_id = headers.get("webhook-id", "")
    timestamp = headers.get("webhook-timestamp", "")
    if not message_id or not timestamp.isdigit() or abs(time.time() - int(timestamp)) > 300:
        return False
    signed = message_id.encode() + b"." + timestamp.encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    for candidate in headers.get("webhook-signature", "").split(" "):
        version, _, signature = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(signature, expected):
            return True
    return False


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body=b"{}"):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/control":
            settings = json.loads(body)
            with lock:
                state.update(settings)
            return self.reply(200)
        with lock:
            answers = state["answers"].get(self.path, [200])
            answer = answers.pop(0) if len(answers) > 1 else answers[0]
            secret = state["secret"]
        record = {
            "path": self.path,
            "id": self.headers.get("webhook-id"),
            "timestamp": self.headers.get("webhook-timestamp"),
            "verified": verify(secret, self.headers, body),
            "answered": answer,
            "content_type": self.headers.get("Content-Type"),
            "body": json.loads(body) if body else None,
        }
        # One write per line under the lock: concurrent deliveries must not interleave.
        with lock:
            sys.stdout.write(json.dumps(record) + "\n")
            sys.stdout.flush()
        if answer == 0:
            stopping.wait(120)
            return
        self.reply(answer)


def exit_when_stdin_closes():
    sys.stdin.buffer.read()
    os._exit(0)


def main():
    threading.Thread(target=exit_when_stdin_closes, daemon=True).start()
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if len(sys.argv) > 2:
        state.update(json.loads(sys.argv[2]))
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    finally:
        stopping.set()


if __name__ == "__main__":
    main()
