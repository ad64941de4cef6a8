"""JSON log lines (FLEETSHARD_LOG_FORMAT=json) for log shippers: one object a line, every line parses.

Each line has `timestamp` (UTC, ISO 8601), `level`, `logger` and `message`, and `shard`, `job`, `hqe`
and `host` where they apply: from a call's `extra=` (`log_context`), and a shard process's own name.
ASCII-only output: whatever a job or the network put into a message (NUL, lone surrogates, newlines)
is escaped, never able to break a line or the encoding. A line stays under MAX_LINE characters:
journald splits longer ones (LineMax, 48K by default) into pieces that no longer parse, so a huge
message keeps its head and an exception its tail (where the error is), each marked as cut.
"""

import json
import logging
import sys
import threading
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from gunicorn.glogging import Logger as GunicornLogger

CONTEXT_KEYS = ("shard", "job", "hqe", "host")
MAX_LINE = 32 * 1024


def log_context(**fields: object) -> dict[str, object]:
    """`extra=` for a log call about a job, HQE or host: `log.info(..., extra=log_context(hqe=7, job=3))`."""
    unknown = set(fields) - set(CONTEXT_KEYS)
    if unknown:
        raise ValueError(f"log context takes {', '.join(CONTEXT_KEYS)}, not {', '.join(sorted(unknown))}")
    return {key: value for key, value in fields.items() if value is not None}


def _own_shard() -> str:
    """The shard this process runs as, when it is one."""
    try:
        if getattr(settings, "ROLE", "") == "shard":
            return str(getattr(settings, "FLEETSHARD_SHARD_HOSTNAME", "") or "")
    except Exception:  # settings not configured (a bare import): no context rather than no log line
        return ""
    return ""


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        shard = _own_shard()
        if shard:
            entry["shard"] = shard
        for key in CONTEXT_KEYS:
            value = record.__dict__.get(key)
            if value is not None and value != "":
                entry[key] = value if isinstance(value, int | float | bool) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        line = json.dumps(entry, ensure_ascii=True, default=str)
        budget = MAX_LINE // 2
        while len(line) >= MAX_LINE and budget > 64:
            line = json.dumps(_cut(entry, budget), ensure_ascii=True, default=str)
            budget //= 2
        return line


def _cut(entry: dict[str, Any], budget: int) -> dict[str, Any]:
    """The entry with each text longer than `budget` characters cut to it: a message keeps its head,
    an exception or stack its tail."""
    cut = dict(entry)
    for key, value in entry.items():
        if isinstance(value, str) and len(value) > budget:
            note = f"[{len(value) - budget} characters cut]"
            cut[key] = f"{note} {value[-budget:]}" if key in ("exception", "stack") else f"{value[:budget]} {note}"
    return cut


def log_uncaught() -> None:
    """An exception nothing caught, in the main thread or another, becomes one log line (JSON in
    JSON mode) instead of Python's traceback on stderr, many lines that are not JSON."""
    log = logging.getLogger("fleetshard.uncaught")

    def main_hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            sys.__excepthook__(exc_type, exc, tb)
            return
        log.critical("uncaught exception: %s", exc_type.__name__, exc_info=(exc_type, exc, tb))

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit or args.exc_value is None:
            return
        name = args.thread.name if args.thread is not None else "?"
        log.critical(
            "uncaught exception in thread %s: %s",
            name,
            args.exc_type.__name__,
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )

    sys.excepthook = main_hook
    threading.excepthook = thread_hook


class JsonStderr:
    """sys.stderr in JSON mode (server/manage.py): log lines pass as they are, and any other line (a
    command's `CommandError: ...`, a library's print) becomes a JSON line of its own, so a log
    shipper reads nothing else. Only lines are rewritten: a partial one waits for its end or a flush."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._pending = (self._pending + text).split("\n")
            for line in lines:
                self._emit(line)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                self._emit(self._pending)
                self._pending = ""
            self._stream.flush()

    def _emit(self, line: str) -> None:
        if line.startswith("{"):
            self._stream.write(line + "\n")
        elif line.strip():
            record = logging.LogRecord("stderr", logging.ERROR, "", 0, line, None, None)
            self._stream.write(JsonFormatter().format(record) + "\n")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class GunicornJsonLogger(GunicornLogger):
    """gunicorn's own error and access logs as the same JSON lines (`serve` uses it in JSON mode)."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for log in (self.error_log, self.access_log):
            for handler in log.handlers:
                handler.setFormatter(JsonFormatter())
