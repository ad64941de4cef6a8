#!/usr/bin/env python3
"""A small TCP proxy on loopback that the chaos run puts between one shard and the master.

Killing this process is how the run cuts that shard's network: every open connection dies with it and
new ones are refused until the run starts it again on the same port. Both ends must be loopback.

Run: `python bench/chaos_proxy.py LISTEN_PORT TARGET_PORT`.
"""

import contextlib
import socket
import sys
import threading

LOOPBACK = "127.0.0.1"


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copies one direction until either side closes; then closes both, so the other pump ends too."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


def serve(listen_port: int, target_port: int) -> None:
    """Accepts forever; each connection gets two pump threads (daemon: they die with the process)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((LOOPBACK, listen_port))
    server.listen(64)
    print(f"proxy {LOOPBACK}:{listen_port} -> {LOOPBACK}:{target_port}", flush=True)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection((LOOPBACK, target_port), timeout=5)
            upstream.settimeout(None)
        except OSError:
            client.close()
            continue
        threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
