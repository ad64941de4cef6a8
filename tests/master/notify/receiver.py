"""A real webhook receiver on loopback for the notification tests: records what it got, answers as told."""

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# What the receiver does with one request: an HTTP status to answer, or a callable that answers itself.
Behaviour = int | Callable[[BaseHTTPRequestHandler], None]


class Receiver:
    """`keep_alive`: answers in HTTP/1.1 and keeps the connection open, as chat services' webhooks do
    (each request notes the client's port, so a test can tell connections apart)."""

    def __init__(
        self, behaviours: list[Behaviour] | None = None, default: Behaviour = 200, keep_alive: bool = False
    ) -> None:
        self.got: list[dict[str, Any]] = []  # every request, also the ones answered with a failure
        self.behaviours = list(behaviours or [])
        self.default = default
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer.lock:
                    outer.got.append(
                        {"headers": dict(self.headers), "body": body, "at": time.time(), "port": self.client_address[1]}
                    )
                    behaviour = outer.behaviours.pop(0) if outer.behaviours else outer.default
                if callable(behaviour):
                    behaviour(self)
                    return
                self.send_response(behaviour)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def delivered(self) -> list[dict[str, Any]]:
        """The JSON bodies of the requests answered 2xx (those the sender counts as delivered)."""
        return [json.loads(r["body"]) for r in self.got]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def hang(seconds: float) -> Behaviour:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        time.sleep(seconds)

    return answer


def redirect(location: str) -> Behaviour:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(302)
        handler.send_header("Location", location)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


def flood(total: int, sent_log: list[int]) -> Behaviour:
    """Answers 200 with `total` bytes of body, sent in 1 MiB pieces until the client hangs up; how many
    bytes went out is appended to `sent_log`."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(total))
        handler.end_headers()
        chunk = b"x" * (1 << 20)
        sent = 0
        try:
            while sent < total:
                handler.wfile.write(chunk)
                sent += len(chunk)
        except OSError:
            pass
        sent_log.append(sent)

    return answer
