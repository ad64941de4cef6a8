"""Bidirectional controls a job wrote (a test name, a job name) are shown escaped on the admin's pages,
never acted on (issue 23: U+202E in a test name read backwards in the admin)."""

import json
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django.test import Client

from master.results.models import TestRun
from tests.support import assert_status

EVIL = "bench\u202egnp.exe\u2066x\u2069"


@pytest.fixture
def root(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def test_a_test_name_with_bidi_controls_is_shown_escaped_in_the_admin(root):
    run = TestRun.objects.create(test=EVIL, start=datetime(2026, 1, 1, tzinfo=UTC), format="gbench", digest="0" * 64)
    for page in ("/admin/master/testrun/", f"/admin/master/testrun/{run.id}/change/"):
        resp = root.get(page)
        assert_status(resp, 200)
        text = resp.content.decode()
        assert not any(c in text for c in "\u202e\u2066\u2069"), page
        assert "bench\\u202egnp.exe\\u2066x\\u2069" in text
        assert resp.get("Content-Length", str(len(resp.content))) == str(len(resp.content))


def test_a_job_name_with_bidi_controls_is_shown_escaped_in_the_admin(root, fleet):
    job = fleet.job(EVIL)
    for page in ("/admin/common/job/", f"/admin/common/job/{job.id}/change/"):
        text = root.get(page).content.decode()
        assert "\u202e" not in text and "bench\\u202egnp.exe" in text, page


def test_json_keeps_them(root, fleet):
    """Not HTML: the API's JSON carries the name as the job wrote it (json escapes nothing it need not)."""
    fleet.job(EVIL)
    resp = root.get("/api/v1/jobs/")
    assert_status(resp, 200)
    assert EVIL in json.dumps(resp.json(), ensure_ascii=False)
