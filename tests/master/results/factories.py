"""Result files made to order: a TensorFlow TestResults document per run."""

import json
from datetime import UTC, datetime, timedelta
from typing import Any

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def tf_file(test: str, start: datetime, timings: dict[str, float], **extra: Any) -> bytes:
    entries = [{"name": name, "iters": 10, "wallTime": wall, "cpuTime": wall / 2} for name, wall in timings.items()]
    doc = {"name": test, "startTime": start.timestamp(), "entries": {"entry": entries}, **extra}
    return json.dumps(doc).encode()


def stepped(n_before: int, n_after: int, before: float = 1.0, after: float = 1.3, n_back: int = 0) -> list[float]:
    """A series with a little deterministic noise that steps from `before` to `after` (and back)."""
    levels = [before] * n_before + [after] * n_after + [before] * n_back
    return [level * (1 + 0.01 * ((i * 7) % 5 - 2)) for i, level in enumerate(levels)]


def hour(i: int) -> datetime:
    return T0 + timedelta(hours=i)
