#!/usr/bin/env python3
"""A round-robin TCP proxy in front of several replicas (scripts/check-openapi.sh).

    round-robin-proxy.py [--port PORT] BACKEND...

BACKEND is host:port or http://host:port (as serve_in_background's $url). Listens on
127.0.0.1:PORT (default 0: a free port), prints `listening on http://127.0.0.1:PORT` (so
serve-in-background.sh can start it), and sends each accepted connection to the next backend
in turn, piping bytes both ways until both sides are done. The round robin is per connection,
not per request: a keep-alive connection stays on its replica. That spreads a fuzzer's calls
well enough, as schemathesis opens new connections often. SIGTERM or SIGINT: exits 0.
Standard library only.
"""

import argparse
import asyncio
import itertools
import signal
import sys
from urllib.parse import urlsplit


def backend_address(text):
    parts = urlsplit(text if "//" in text else "//" + text)
    if not parts.hostname or not parts.port:
        raise argparse.ArgumentTypeError(f"{text!r} is not host:port or http://host:port")
    return parts.hostname, parts.port


async def pipe(reader, writer):
    """Copies until end of input, then passes the end on (a half close, as the peer sent it)."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        # One side reset or vanished: the other gets no more either.
        writer.close()


async def serve(port, backends):
    turn = itertools.cycle(backends)

    async def accept(client_reader, client_writer):
        host, backend_port = next(turn)
        try:
            backend_reader, backend_writer = await asyncio.open_connection(host, backend_port)
        except OSError as error:
            print(f"cannot connect to {host}:{backend_port}: {error}", file=sys.stderr, flush=True)
            client_writer.close()
            return
        try:
            await asyncio.gather(pipe(client_reader, backend_writer), pipe(backend_reader, client_writer))
        finally:
            for writer in (backend_writer, client_writer):
                writer.close()
                try:
                    await writer.wait_closed()
                except OSError:
                    pass

    server = await asyncio.start_server(accept, "127.0.0.1", port)
    print(f"listening on http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    # Not `async with server`: since Python 3.12 that waits for every connection to end. The
    # connections left are cancelled as asyncio.run returns.
    server.close()


def main():
    parser = argparse.ArgumentParser(description="Round-robin TCP proxy, one backend per connection.")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    parser.add_argument("backends", nargs="+", type=backend_address, metavar="BACKEND",
                        help="host:port or http://host:port")
    arguments = parser.parse_args()
    asyncio.run(serve(arguments.port, arguments.backends))


if __name__ == "__main__":
    main()
