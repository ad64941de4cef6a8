"""One webhook POST, made safe against hostile URLs and receivers (docs/notifications.md, "Safety").

- http and https only; the URL's name is resolved when a connection is made and every address is
  checked: loopback, private, link-local and other non-global addresses are refused unless
  FLEETSHARD_NOTIFY_ALLOW_PRIVATE=1 (which allows loopback and private ones only: link-local, where
  cloud metadata services answer, and multicast, unspecified and reserved ones are never allowed). The
  socket connects to the address that was checked, not to the name again: no window for DNS rebinding.
- No redirect is followed: a 3xx is a failed attempt, recorded with its Location.
- One deadline for the whole attempt (resolving the name, connect, TLS, request, response): one
  watchdog thread shuts the socket of any attempt past its deadline, so a receiver that trickles its
  headers or streams forever is cut off, and a name server that never answers is given up on.
- At most RESPONSE_KEPT bytes of the response body are read. A connection whose answer was read to
  its end is kept for the subscription's next delivery (a `Connection`), for at most KEEP_S and while
  used within IDLE_S: a new connection per request (a TCP handshake, and on the receiver's side often
  a new thread) cost more than the request itself. After KEEP_S the name is resolved and checked again.
"""

import contextlib
import functools
import http.client
import ipaddress
import math
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

RESPONSE_KEPT = 1024
TIMEOUT_S = 10.0
MAX_URL = 2000
# A kept connection is made anew (its name resolved and its address checked again) after KEEP_S, and
# closed when unused for IDLE_S (receivers close idle ones too, often after 5-60 s).
KEEP_S = 60.0
IDLE_S = 15.0
# Threads that resolve names, so that a lookup waits no longer than the attempt's deadline
# (getaddrinfo cannot be interrupted): one stuck on a dead name server holds a thread, never a sender.
RESOLVERS = 4


class Refused(Exception):
    """The URL or the address it resolves to may not be sent to; nothing was sent."""


@dataclass(frozen=True)
class Outcome:
    ok: bool
    status: int | None = None
    body: str = ""
    error: str = ""


class _Lines:
    """The response's file, noting a line cut off by the end of the stream: http.client takes the end as
    the end of the headers, so a receiver that hangs up inside them would count as having answered."""

    def __init__(self, fp: Any) -> None:
        self._fp = fp
        self.cut = False

    def readline(self, limit: int = -1) -> bytes:
        line: bytes = self._fp.readline(limit)
        if not line.endswith(b"\n") and (limit < 0 or len(line) < limit):
            self.cut = True
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fp, name)


class _Response(http.client.HTTPResponse):
    def __init__(self, sock: socket.socket, method: str) -> None:
        super().__init__(sock, method=method)
        self.lines = _Lines(self.fp)
        self.fp = self.lines  # type: ignore[assignment]


def check_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path with query) of a webhook URL, or Refused naming what is wrong."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL:
        raise Refused(f"a webhook URL needs 1-{MAX_URL} characters")
    return _check_url(url)


@functools.lru_cache(maxsize=1024)
def _check_url(url: str) -> tuple[str, str, int, str]:
    """check_url's answer for a string, remembered (a refusal is not): a subscription's URL is checked
    for each of its deliveries, and checking it char by char cost a tenth of a kept-alive delivery."""
    if any(c.isspace() or ord(c) < 32 or c == "\x7f" for c in url):
        raise Refused("a webhook URL may not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Refused(f"invalid webhook URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise Refused(f"a webhook URL must be http or https, not {parts.scheme or 'without a scheme'!r}")
    if not parts.hostname:
        raise Refused("a webhook URL needs a host name")
    if parts.username is not None or parts.password is not None:
        raise Refused("a webhook URL may not carry a user name or password")
    if port == 0:
        raise Refused("a webhook URL's port must be 1-65535, not 0")
    port = port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port, path


def address_refusal(address: str, allow_private: bool) -> str | None:
    """Why `address` may not be sent to, or None."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.is_site_local:
            return f"{ip} is a site-local address"
        # 6to4 goes out through a relay to the IPv4 address it carries: only a global one will do.
        if ip.sixtofour is not None and not ip.sixtofour.is_global:
            return f"{ip} is a 6to4 address of {ip.sixtofour}, which is not a global address"
        ip = ip.ipv4_mapped or ip
    if ip.is_loopback:  # before is_reserved, which ::1 is too
        return None if allow_private else f"{ip} is a loopback address (FLEETSHARD_NOTIFY_ALLOW_PRIVATE=1 allows it)"
    if ip.is_link_local or ip.is_multicast or ip.is_unspecified or ip.is_reserved:
        return f"{ip} is a link-local, multicast, unspecified or reserved address"
    if ip.is_global:
        return None
    if allow_private and (ip.is_loopback or ip.is_private):
        return None
    kind = "loopback" if ip.is_loopback else "private"
    return f"{ip} is a {kind} address (FLEETSHARD_NOTIFY_ALLOW_PRIVATE=1 allows it)"


class Unresolvable(Exception):
    """The URL's name did not resolve (`late`: not in time); nothing was sent."""

    def __init__(self, message: str, late: bool = False) -> None:
        super().__init__(message)
        self.late = late


class _Alarm:
    """One attempt's deadline: `fire` runs the cut-off unless `disarm` came first, never after it."""

    def __init__(self, deadline: float, action: Callable[[], None], watchdog: "_Watchdog") -> None:
        self.deadline = deadline
        self._action = action
        self._watchdog = watchdog
        self._lock = threading.Lock()
        self._disarmed = False
        self.fired = False

    def fire(self) -> None:
        with self._lock:
            if self._disarmed:
                return
            self.fired = True
            self._action()

    def disarm(self) -> bool:
        """Whether it fired: once this returns, it never will."""
        self._watchdog.forget(self)
        with self._lock:
            self._disarmed = True
            return self.fired


class _Watchdog:
    """One thread that fires every attempt's alarm at its deadline. A timer thread per attempt cost
    more than a kept-alive request: starting a thread waits until it runs (2 ms on a busy machine).
    It holds only the alarms of attempts in flight (a few: one per sending thread), so it sleeps until
    the earliest of them, and an attempt that ends in time never wakes it."""

    def __init__(self) -> None:
        self._wake = threading.Condition()
        self._alarms: set[_Alarm] = set()
        self._until = math.inf  # when the thread wakes next
        threading.Thread(target=self._run, name="notify-deadlines", daemon=True).start()

    def arm(self, deadline: float, action: Callable[[], None]) -> _Alarm:
        alarm = _Alarm(deadline, action, self)
        with self._wake:
            self._alarms.add(alarm)
            if deadline < self._until:
                self._wake.notify()
        return alarm

    def forget(self, alarm: _Alarm) -> None:
        with self._wake:
            self._alarms.discard(alarm)

    def _run(self) -> None:
        while True:
            with self._wake:
                now = time.monotonic()
                due = [a for a in self._alarms if a.deadline <= now]
                self._alarms.difference_update(due)
                if not due:
                    self._until = min((a.deadline for a in self._alarms), default=math.inf)
                    self._wake.wait(None if self._until == math.inf else self._until - now)
                    continue
            for alarm in due:
                alarm.fire()  # one disarmed meanwhile does nothing


class _PerProcess:
    """The watchdog and the resolvers' pool, made on first use in each process: `serve` forks its
    workers, and a thread (or a lock another thread held) does not survive a fork."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._watchdog: _Watchdog | None = None
        self._resolvers: ThreadPoolExecutor | None = None
        self._tls: ssl.SSLContext | None = None
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._pid, self._watchdog, self._resolvers = 0, None, None

    def _made(self) -> None:
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._watchdog = _Watchdog()
                    self._resolvers = ThreadPoolExecutor(RESOLVERS, thread_name_prefix="notify-resolve")
                    self._pid = os.getpid()

    def watchdog(self) -> _Watchdog:
        self._made()
        assert self._watchdog is not None
        return self._watchdog

    def resolvers(self) -> ThreadPoolExecutor:
        self._made()
        assert self._resolvers is not None
        return self._resolvers

    def tls(self) -> ssl.SSLContext:
        """The default TLS context, made once: loading the system's CA certificates takes milliseconds."""
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls


_process = _PerProcess()


def resolve(host: str, port: int, allow_private: bool, timeout_s: float = TIMEOUT_S) -> tuple[int, str]:
    """The family and first allowed address of `host`; Refused, naming the addresses, when none is;
    Unresolvable when the name does not resolve within `timeout_s`."""
    try:
        ipaddress.ip_address(host)
        literal = True
    except ValueError:
        literal = False
    try:
        if literal:  # no lookup: nothing to wait for
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        else:
            lookup = _process.resolvers().submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
            try:
                infos = lookup.result(max(timeout_s, 0.0))
            except FutureTimeout:
                lookup.cancel()
                raise Unresolvable(f"cannot resolve {host} in time", late=True) from None
    except (OSError, UnicodeError) as exc:
        raise Unresolvable(f"cannot resolve {host}: {exc}") from None
    reasons = []
    for family, _, _, _, sockaddr in infos:
        reason = address_refusal(str(sockaddr[0]), allow_private)
        if reason is None:
            return family, str(sockaddr[0])
        reasons.append(reason)
    where = host if literal else f"{host} resolves to {', '.join(dict.fromkeys(str(i[4][0]) for i in infos))}"
    raise Refused(f"refused: {where}: {reasons[0]}")


_Key = tuple[str, str, int, bool]


class Connection:
    """A subscription's kept-alive connection to its receiver, at an address checked when it was made;
    used by one thread at a time (the sender's, for that subscription)."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._key: _Key | None = None
        self._made = 0.0
        self._used = 0.0

    def take(self, key: _Key, now: float) -> tuple[socket.socket, float] | None:
        """The kept socket for `key` (and when it was made) if it may still be used; else closes it."""
        sock, made = self._sock, self._made
        fresh_enough = now - made < KEEP_S and now - self._used < IDLE_S
        self._sock = None
        if sock is not None and key == self._key and fresh_enough:
            return sock, made
        if sock is not None:
            _close(sock)
        return None

    def keep(self, sock: socket.socket, key: _Key, made: float) -> None:
        self.close()
        self._sock, self._key, self._made, self._used = sock, key, made, time.monotonic()

    def idle_s(self) -> float:
        return time.monotonic() - self._used if self._sock is not None else 0.0

    def close(self) -> None:
        if self._sock is not None:
            _close(self._sock)
        self._sock = None


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


class _Target:
    """The socket an attempt is using, which its deadline shuts (a kept one, or the new one)."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None

    def cut(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)


class _Stale(Exception):
    """A kept connection the receiver had closed before this request: it never got it."""


def _connect(scheme: str, host: str, port: int, allow_private: bool, deadline: float, target: _Target) -> socket.socket:
    family, address = resolve(host, port, allow_private, deadline - time.monotonic())
    sock = socket.socket(family, socket.SOCK_STREAM)
    target.sock = sock
    try:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        sock.connect((address, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if scheme == "https":
            sock = _process.tls().wrap_socket(sock, server_hostname=host)
            target.sock = sock
    except BaseException:
        _close(sock)
        raise
    return sock


def _exchange(sock: socket.socket, request: bytes, *, kept: bool, keep: bool, deadline: float) -> tuple[Outcome, bool]:
    """Sends the request on `sock` and reads the answer: (the outcome, whether the connection may be
    used again). A `kept` connection found closed before any answer raises _Stale."""
    sock.settimeout(max(deadline - time.monotonic(), 0.001))
    try:
        sock.sendall(request)
        response = _Response(sock, method="POST")
        response.begin()
    except ConnectionError:  # RemoteDisconnected too: the answer's first line was empty
        if kept and time.monotonic() < deadline:
            raise _Stale() from None
        raise
    try:
        if response.lines.cut:
            return Outcome(False, response.status, "", "the answer ended inside its headers"), False
        note = ""
        try:
            body = response.read(RESPONSE_KEPT) if response.status not in (204, 304) else b""
        except Exception as exc:  # the answer's status is known: its body is only kept for people to read
            body, note = b"", f" (body not read: {type(exc).__name__})"
        # Read to its end, and not to be closed: the connection may carry the next request.
        reusable = keep and not note and not response.will_close and (response.isclosed() or response.length == 0)
    finally:
        response.close()
    text = body.decode("utf-8", "replace").replace("\x00", "\ufffd") + note
    if 300 <= response.status < 400:
        location = (response.getheader("Location") or "")[:500]
        return Outcome(
            False, response.status, text, f"redirect refused (HTTP {response.status} to {location!r})"
        ), reusable
    if 200 <= response.status < 300:
        return Outcome(True, response.status, text), reusable
    return Outcome(False, response.status, text, f"HTTP {response.status}"), reusable


def _request(scheme: str, host: str, port: int, path: str, body: bytes, headers: dict[str, str], keep: bool) -> bytes:
    default_port = 443 if scheme == "https" else 80
    host_header = host if port == default_port else f"{host}:{port}"
    if ":" in host and not host.startswith("["):
        host_header = f"[{host}]" if port == default_port else f"[{host}]:{port}"
    lines = [f"POST {path} HTTP/1.1", f"Host: {host_header}", f"Content-Length: {len(body)}"]
    if not keep:
        lines.append("Connection: close")
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def post(
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    allow_private: bool,
    timeout_s: float = TIMEOUT_S,
    connection: Connection | None = None,
) -> Outcome:
    """POSTs `body` to `url`, on `connection`'s kept socket when it has a usable one (and keeping the
    socket there for the next request when the answer allows); never raises for what the network or
    the receiver does."""
    try:
        scheme, host, port, path = check_url(url)
    except Refused as exc:
        return Outcome(False, error=str(exc))
    started = time.monotonic()
    deadline = started + timeout_s
    key: _Key = (scheme, host, port, allow_private)
    keep = connection is not None
    kept = connection.take(key, started) if connection is not None else None
    sock, made = kept if kept is not None else (None, started)
    request = _request(scheme, host, port, path, body, headers, keep)
    target = _Target()
    target.sock = sock
    alarm = _process.watchdog().arm(deadline, target.cut)
    reusable = False
    try:
        while True:
            reused = sock is not None
            if sock is None:
                sock, made = _connect(scheme, host, port, allow_private, deadline, target), time.monotonic()
            try:
                outcome, reusable = _exchange(sock, request, kept=reused, keep=keep, deadline=deadline)
                break
            except _Stale:  # once more, on a new connection
                _close(sock)
                sock = None
    except Unresolvable as exc:
        outcome = Outcome(False, error=f"cannot resolve {host} within {timeout_s:g} s" if exc.late else str(exc))
    except Refused as exc:
        outcome = Outcome(False, error=str(exc))
    except Exception as exc:
        if alarm.fired or time.monotonic() >= deadline:
            outcome = Outcome(False, error=f"no complete answer within {timeout_s:g} s")
        else:
            outcome = Outcome(False, error=f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__)
    finally:
        fired = alarm.disarm()
    if sock is not None:
        if reusable and not fired and connection is not None:
            connection.keep(sock, key, made)
        else:
            _close(sock)
    return outcome
