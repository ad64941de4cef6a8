"""Notification delivery under load: N events to three loopback receivers, one down for a while and
one failing half the time; checks that each receiver got every event, in order, none lost, with one
delivery id each, and prints the event-to-delivery latency and how fast a backlog drains.

Run: `.venv/bin/python bench/notify.py [--events 10000] [--down 60] [--rate 500]` (SQLite in a
temporary directory; with DATABASE_URL=postgres://... the database it names is used and its
notification tables emptied). `--code DIR` runs the sender of another checkout (an export of an older
commit) with this same harness, to compare before and after on one machine in one sitting.

The receivers are a process of their own (as a real receiver is another machine), each a threaded
HTTP/1.1 server that keeps connections alive, as chat services' webhooks do; the sender, the event
writer and the database client share this one.
"""

import argparse
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def serve_receiver(port: int, fail_share: float, out: str) -> None:
    """One receiver, until SIGTERM: then writes what it got (first success per event, every delivery
    id per event, the order of successes) to `out` as JSON."""
    first_seen: dict[int, float] = {}
    order: list[int] = []
    ids: dict[int, set[str]] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            fail = random.random() < fail_share
            now = time.time()
            with lock:
                n = body["data"]["n"]
                ids.setdefault(n, set()).add(body["delivery"])
                if not fail:
                    first_seen.setdefault(n, now)
                    order.append(n)
            self.send_response(500 if fail else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True

    def finish(*_: Any) -> None:
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, finish)
    print("ready", flush=True)
    server.serve_forever()
    with lock:
        got = {"first_seen": first_seen, "order": order, "ids": {n: sorted(v) for n, v in ids.items()}}
    Path(out).write_text(json.dumps(got))


class Receiver:
    """A receiver process on a fixed port (kept while it is down, for when it comes back)."""

    def __init__(self, name: str, fail_share: float, tmp: str) -> None:
        self.name, self.fail_share = name, fail_share
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.out = f"{tmp}/receiver-{self.port}.json"
        self.proc: subprocess.Popen[str] | None = None
        self.back_at = 0.0

    def start(self) -> None:
        args = [sys.executable, __file__, "--receiver", str(self.port), str(self.fail_share), self.out]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"
        self.back_at = time.time()

    def results(self) -> dict[str, Any]:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        got: dict[str, Any] = json.loads(Path(self.out).read_text())
        return got


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=10000)
    parser.add_argument("--down", type=float, default=60.0, help="seconds the first receiver is down")
    parser.add_argument("--rate", type=float, default=500.0, help="events written per second")
    parser.add_argument("--deadline", type=float, default=1800.0, help="seconds to wait for every delivery")
    parser.add_argument("--code", default=str(ROOT), help="the checkout whose sender to run (default: this one)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.code).resolve()))
    tmp = tempfile.mkdtemp(prefix="fleetshard-notify-bench-")
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{tmp}/master.sqlite3")
    os.environ["FLEETSHARD_ROLE"] = "master"
    os.environ["FLEETSHARD_DATA_DIR"] = tmp
    os.environ["FLEETSHARD_NOTIFY_ALLOW_PRIVATE"] = "1"
    # Short retries (the defaults wait 10 s, doubling): the failing-half receiver fails thousands of times.
    os.environ["FLEETSHARD_NOTIFY_BACKOFF_S"] = os.environ.get("FLEETSHARD_NOTIFY_BACKOFF_S", "0.02")
    os.environ["FLEETSHARD_NOTIFY_BACKOFF_MAX_S"] = os.environ.get("FLEETSHARD_NOTIFY_BACKOFF_MAX_S", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "server.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    logging.getLogger("master.notify.sender").setLevel(logging.WARNING)
    from master.notify import events, sender, services
    from master.notify.models import Delivery, NotificationEvent, Subscription

    Delivery.objects.all().delete()
    NotificationEvent.objects.all().delete()
    Subscription.objects.all().delete()
    down = Receiver(f"down {args.down:g} s", 0.0, tmp)
    flaky, up = Receiver("fails half", 0.5, tmp), Receiver("up", 0.0, tmp)
    flaky.start()
    up.start()
    subs = {}
    for box in (down, flaky, up):
        url = f"http://127.0.0.1:{box.port}/hook"
        new = services.NewSubscription(url=url, events=["host.missing"])
        subs[box.name] = services.add_subscription(new, acting_user=None).id
    stop = threading.Event()
    s = sender.Sender()
    thread = threading.Thread(target=s.run, args=(stop,), daemon=True)
    thread.start()
    created: dict[int, float] = {}
    started = time.time()
    back_at = started + args.down
    batch = 50
    for first in range(0, args.events, batch):
        now = time.time()
        for n in range(first, min(first + batch, args.events)):
            created[n] = now
        events.emit([events.Event("host.missing", {"n": n}) for n in range(first, min(first + batch, args.events))])
        pause = started + (first + batch) / args.rate - time.time()
        if pause > 0:
            time.sleep(pause)
        if down.proc is None and time.time() >= back_at:
            down.start()
    written = time.time() - started
    if down.proc is None:
        time.sleep(max(0.0, back_at - time.time()))
        down.start()
    deadline = time.time() + args.deadline

    def delivered(box: Receiver) -> int:
        return Delivery.objects.filter(subscription_id=subs[box.name], status="delivered").count()

    while time.time() < deadline and any(delivered(b) < args.events for b in (down, flaky, up)):
        time.sleep(0.5)
    stop.set()
    thread.join(30)
    took = time.time() - started
    print(
        f"{args.events} events written in {written:.1f} s ({connection.vendor}, sender of {args.code}); "
        f"receiver 1 down {args.down:g} s"
    )
    print("| receiver | delivered | in order | one delivery id each | p50 latency | p99 latency | drain rate |")
    print("|---|---|---|---|---|---|---|")
    for box in (down, flaky, up):
        got = box.results()
        first_seen = {int(n): t for n, t in got["first_seen"].items()}
        lat = sorted(first_seen[n] - created[n] for n in first_seen)
        firsts = list(dict.fromkeys(got["order"]))
        in_order = firsts == sorted(firsts)
        one_id = all(len(v) == 1 for v in got["ids"].values())
        # How fast the sender drained a backlog: the receiver that came back to every event waiting.
        rate = ""
        if box is down and first_seen:
            span = max(first_seen.values()) - box.back_at
            rate = f"{len(first_seen) / span:.0f}/s" if span > 0 else ""
        print(
            f"| {box.name} | {len(first_seen)}/{args.events} | {in_order} | {one_id} | {pct(lat, 0.5):.3f} s "
            f"| {pct(lat, 0.99):.3f} s | {rate} |"
        )
    print(f"Total: {took:.1f} s")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--receiver":
        serve_receiver(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
    else:
        main()
