"""Why a request to a fleetshard server got no answer, in a few words: what a person reads in a log line
or an error (`connection refused`, `timed out`, `TLS: wrong version number`, `DNS: no such host`) instead
of urllib3's chain of wrapped exceptions."""

import errno
import re
import socket

import requests

_SSL_REASON = re.compile(r"\[SSL(?:: [A-Z_]+)?\] ([^(')\"]+)")


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    pending: list[BaseException | None] = [exc]
    while pending and len(seen) < 20:
        item = pending.pop()
        if item is None or any(item is s for s in seen):
            continue
        seen.append(item)
        pending += [item.__cause__, item.__context__, *(a for a in item.args if isinstance(a, BaseException))]
        reason = getattr(item, "reason", None)
        if isinstance(reason, BaseException):
            pending.append(reason)
    return seen


def request_failure(exc: BaseException) -> str:
    """The cause of a failed request as a short phrase, without URLs or retry counts."""
    if isinstance(exc, requests.exceptions.SSLError):
        match = _SSL_REASON.search(str(exc))
        return f"TLS: {match.group(1).strip() if match else 'handshake failed'}"
    if isinstance(exc, requests.exceptions.Timeout):
        return "timed out"
    for cause in _chain(exc):
        if isinstance(cause, socket.gaierror):
            return "DNS: no such host"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, ConnectionResetError):
            return "the server closed the connection"  # with a reset or without: the same to a person
        if isinstance(cause, OSError) and cause.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return "network unreachable"
    text = str(exc)
    if "Name or service not known" in text or "nodename nor servname" in text or "getaddrinfo" in text:
        return "DNS: no such host"
    if "Connection refused" in text:
        return "connection refused"
    if isinstance(exc, requests.exceptions.ChunkedEncodingError | requests.exceptions.ContentDecodingError):
        return "the answer broke off"
    if "RemoteDisconnected" in text or "Connection aborted" in text:
        return "the server closed the connection"
    return type(exc).__name__
