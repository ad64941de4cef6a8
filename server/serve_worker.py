"""gunicorn's threaded worker, hardened for a server whose thread pool also holds long-polls.

gunicorn hands each new connection to a pool thread at once, which waits up to 5 s for its first
byte: a few hundred connections that send nothing (a careless or hostile client, a port scan) keep
every thread waiting in turn, and heartbeats and the admin queue behind them for minutes. Here a new
connection waits on the worker's poller, as a kept-alive one does, and takes a thread only once its
request starts to arrive; one that sends nothing is closed after the keep-alive timeout. A client that
stops sending (or reading) halfway through a request is cut off after IO_STALL_S.
"""

import errno
import logging
import resource
import selectors
import socket
import struct
import time
from functools import partial
from typing import Any

from gunicorn.workers.gthread import TConn, ThreadWorker

# Connections a worker keeps open beyond its threads: idle ones (kept alive, or yet to send a byte)
# cost a file descriptor each, and a full worker stops accepting, heartbeats and admin included.
IDLE_CONNECTIONS = 1000
# The files a worker opens besides its connections: database, logs, sockets of its own.
OWN_FILES = 64
# How long a new connection may take to send its request's first byte (gunicorn's own wait for it).
FIRST_BYTE_S = 5.0
# The longest a request's read or its response's write may stall before its connection is closed.
IO_STALL_S = 10


def _stall_limit(sock: socket.socket) -> None:
    """Kernel timeouts, which outlast gunicorn's switching the socket between blocking and not."""
    limit = struct.pack("ll", IO_STALL_S, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)


def connection_budget(busy: int) -> int:
    """How many connections a worker may hold: `busy` (its threads) plus IDLE_CONNECTIONS, as far as
    the open-files limit allows once its soft limit is raised to the hard one (else gunicorn's accept
    fails with EMFILE and the worker dies)."""
    wanted = busy + IDLE_CONNECTIONS + OWN_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    fits = wanted if soft == resource.RLIM_INFINITY else soft
    return max(1, fits - OWN_FILES)


class _StalledClients(logging.Filter):
    """A connection cut off for stalling is the client's doing: one line, not a traceback per client."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], (BlockingIOError, TimeoutError)):
            record.msg, record.args, record.exc_info = "closed a connection stalled for %d s", (IO_STALL_S,), None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


class PollingThreadWorker(ThreadWorker):
    def init_process(self) -> None:
        logging.getLogger("gunicorn.error").addFilter(_StalledClients())
        super().init_process()

    def accept(self, listener: Any) -> None:
        try:
            client, address = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        _stall_limit(client)
        conn = TConn(self.cfg, client, address, listener.getsockname())
        # pending_conns stays in timeout order: every entry is put there here, with the same delay.
        conn.timeout = time.monotonic() + FIRST_BYTE_S
        self.pending_conns.append(conn)
        self.poller.register(client, selectors.EVENT_READ, partial(self.on_pending_socket_readable, conn))
