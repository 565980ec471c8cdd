"""Opens N event streams (GET /events over HTTP/1.0) and counts the events each receives.

Prints one line when told to stop (SIGTERM): events received in total, and by the slowest and
fastest stream. Reads with one selector, so 1,000 streams cost one thread."""
import selectors, signal, socket, sys, urllib.parse

url, count = urllib.parse.urlparse(sys.argv[1]), int(sys.argv[2])
selector = selectors.DefaultSelector()
received = {}
for index in range(count):
    connection = socket.create_connection((url.hostname, url.port))
    connection.sendall(b"GET /events?types=task.state HTTP/1.0\r\n\r\n")
    connection.setblocking(False)
    selector.register(connection, selectors.EVENT_READ, index)
    received[index] = 0
print("ready", flush=True)
running = True


def stop(*_):
    global running
    running = False


signal.signal(signal.SIGTERM, stop)
while running:
    for key, _ in selector.select(timeout=0.2):
        try:
            data = key.fileobj.recv(1 << 20)
        except BlockingIOError:
            continue
        if not data:
            selector.unregister(key.fileobj)
            continue
        received[key.data] += data.count(b"\nevent: ")
values = received.values()
print(f"{sum(values)} {min(values)} {max(values)}", flush=True)
