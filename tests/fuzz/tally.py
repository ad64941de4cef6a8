"""Counts of the fuzz suites' cases and failures, printed at the end of the run (`make fuzz`).

The suites record every failing case instead of stopping at the first one, so the summary says how
many of the generated cases failed, not only that one did.
"""

import os
from collections import Counter
from dataclasses import dataclass, field

# How many heartbeat bodies to generate, and how many requests per REST operation. `make test` runs
# the short defaults, derandomised; `make fuzz` raises both and randomises.
HEARTBEAT_CASES = int(os.environ.get("FLEETSHARD_FUZZ_CASES", "200"))
REST_CASES_PER_OPERATION = int(os.environ.get("FLEETSHARD_FUZZ_REST_CASES", "10"))
# Hostile result files, job traces and log chunks sent through a real shard's uploader.
UPLOAD_CASES = int(os.environ.get("FLEETSHARD_FUZZ_UPLOAD_CASES", "24"))
DERANDOMIZE = os.environ.get("FLEETSHARD_FUZZ_RANDOM", "") != "1"
MAX_SHOWN_FAILURES = 5


@dataclass
class Tally:
    """One suite's counts; `failures` keeps the first few failing cases for the report."""

    name: str
    cases: int = 0
    failed: int = 0
    operations: set[str] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    accepted_updates: int = 0

    def fail(self, description: str) -> None:
        self.failed += 1
        if len(self.failures) < MAX_SHOWN_FAILURES:
            self.failures.append(description)

    def report(self) -> str:
        return "\n\n".join(self.failures)

    def spread(self) -> str:
        """What the cases were answered, so a run shows it reached past the parser."""
        codes = ", ".join(f"{code}: {n}" for code, n in sorted(self.statuses.items()))
        return f"{self.name} answers {codes}" + (
            f"; {self.accepted_updates} updates accepted" if self.name == "heartbeat" else ""
        )


HEARTBEAT = Tally("heartbeat")
REST = Tally("rest")
UPLOADS = Tally("uploads")


def details() -> list[str]:
    return [t.spread() for t in (HEARTBEAT, REST, UPLOADS) if t.cases]


def summary() -> str | None:
    """The `fuzz:` line, or None when no fuzz suite ran."""
    parts = []
    if HEARTBEAT.cases:
        parts.append(f"heartbeat {HEARTBEAT.cases} cases, {HEARTBEAT.failed} failures")
    if REST.cases:
        parts.append(f"rest {REST.cases} cases over {len(REST.operations)} operations, {REST.failed} failures")
    if UPLOADS.cases:
        parts.append(f"uploads {UPLOADS.cases} records, {UPLOADS.failed} failures")
    return "fuzz: " + "; ".join(parts) if parts else None
