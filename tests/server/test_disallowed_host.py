"""A request with a Host header not in ALLOWED_HOSTS is refused with one WARNING line, no traceback
(issue 23: Django logged a traceback at ERROR for every one, and scanners send many)."""

import logging
import socket

from django.test import Client

from tests.support import assert_status, wait_until


def test_one_warning_line_without_a_traceback(db, caplog):
    with caplog.at_level(logging.INFO):
        resp = Client().get("/admin/login/", HTTP_HOST="evil.example")
    assert_status(resp, 400)
    [record] = [r for r in caplog.records if r.name == "django.security.DisallowedHost"]
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "Invalid HTTP_HOST header: 'evil.example'" in record.getMessage()


def test_served(own_master):
    port = int(own_master.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /admin/login/ HTTP/1.0\r\nHost: evil.example\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.0 400")
    log_path = own_master.role.data_dir / f"master-{port}.log"
    wait_until(lambda: "evil.example" in log_path.read_text(), timeout=10, what="the refusal's log line")
    lines = [line for line in log_path.read_text().splitlines() if "evil.example" in line and "Invalid" in line]
    assert len(lines) == 1 and " WARNING django.security.DisallowedHost: " in lines[0], lines
    assert "Traceback" not in log_path.read_text()
