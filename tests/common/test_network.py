"""A failed request's cause in a few words (common/network.py), against real sockets on loopback: what the
shard logs once per failed heartbeat and what the command line says."""

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import requests

from common.network import request_failure
from tests.support import free_port


def failure(url: str, timeout: float = 5.0) -> str:
    with pytest.raises(requests.RequestException) as info:
        requests.get(url, timeout=timeout)
    return request_failure(info.value)


@contextmanager
def listener(answer: bytes | None) -> Iterator[int]:
    """A loopback socket that answers each connection with `answer` (None: accepts and says nothing)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            held.append(conn)
            if answer is not None:
                conn.recv(65536)
                conn.sendall(answer)
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


def test_connection_refused():
    assert failure(f"http://127.0.0.1:{free_port()}/") == "connection refused"


def test_a_silent_server_times_out():
    with listener(None) as port:
        assert failure(f"http://127.0.0.1:{port}/", timeout=0.3) == "timed out"


def test_https_against_plain_http_is_named_tls():
    with listener(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n") as port:
        assert failure(f"https://127.0.0.1:{port}/").startswith("TLS: ")


def test_an_unknown_name_is_dns():
    assert failure("http://no-such-host.invalid/") == "DNS: no such host"


def test_a_connection_closed_without_an_answer():
    with listener(b"") as port:
        assert failure(f"http://127.0.0.1:{port}/") == "the server closed the connection"
