"""The admin's job page in a real browser shows a running job's log growing: a real shard runs a job
that prints a line every half second and ships its log; the page (master/static/master/joblog.js)
reads it from the REST API with the admin's session and stops once the entry ended."""

import re
import uuid
from typing import Any

import pytest

from tests.shard.fleet import new_shard, submit
from tests.support import Master, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

PASSWORD = "fleetshard-log-test"
COMMAND = 'for i in $(seq 1 16); do echo "line $i <b>not bold</b>"; sleep 0.5; done'


def login(page: Any, base: str, user: str, next_path: str) -> None:
    page.goto(base + next_path)
    page.fill("#id_username", user)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(re.escape(base + next_path) + r"$"))


def until_held(page: Any, held: list[Any]) -> None:
    """Until the page's next read waits in `held`: a route handler runs only inside a Playwright call."""
    for _ in range(300):
        if held:
            return
        page.wait_for_timeout(100)
    raise AssertionError("the page made no read of the log in 30 s")


def test_the_job_page_shows_a_running_jobs_log_growing(master_server: Master, chromium: Any, tmp_path: Any) -> None:
    from playwright.sync_api import expect

    user = f"log-viewer-{uuid.uuid4().hex[:6]}"
    master_server.shell(
        f"from django.contrib.auth.models import User\nUser.objects.create_superuser({user!r}, '', {PASSWORD!r})\n"
        "result = None"
    )
    shard = new_shard(master_server, tmp_path, hosts=1)
    (job,) = submit(master_server, [{"name": "ticking", "command": COMMAND, "meta_hosts": [[shard.label, 1]]}])
    context = chromium.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(30_000)
    page = context.new_page()
    shard.process.start()
    try:
        login(page, master_server.url, user, f"/admin/common/job/{job}/change/")
        live = page.locator(".fs-live-log pre.fs-live")
        expect(live).to_contain_text("line 2")
        expect(page.locator(".fs-live-log .fs-log-note")).to_contain_text("live: Running")
        early = live.inner_text()
        assert "line 14" not in early, early
        expect(live).to_contain_text("line 8")
        assert len(live.inner_text()) > len(early)
        # The page reads on until the entry ended, then stops asking.
        expect(page.locator(".fs-live-log")).to_have_attribute("data-state", "ended", timeout=60_000)
        text = live.inner_text()
        assert text.splitlines() == [f"line {i} <b>not bold</b>" for i in range(1, 17)], text
        # A job's output is text on the page, never markup.
        assert page.locator(".fs-live-log pre b").count() == 0
        assert "live:" not in page.locator(".fs-live-log .fs-log-note").inner_text()
    finally:
        context.close()
        shard.process.stop()
    wait_until(lambda: shard.process.proc is not None and shard.process.proc.poll() is not None, what="shard stop")


def test_a_page_left_open_on_a_chatty_job_keeps_only_the_last_lines(
    master_server: Master, chromium: Any, tmp_path: Any
) -> None:
    from playwright.sync_api import expect

    user = f"log-keeper-{uuid.uuid4().hex[:6]}"
    master_server.shell(
        f"from django.contrib.auth.models import User\nUser.objects.create_superuser({user!r}, '', {PASSWORD!r})\n"
        "result = None"
    )
    go = tmp_path / "go"
    # 1.5 MB in lines of 100 bytes, once the page is open (it shows a log's last 256 KiB at first).
    command = f'while [ ! -e "{go}" ]; do sleep 0.1; done; head -c 1485000 /dev/zero | tr "\\0" x | fold -w 99'
    shard = new_shard(master_server, tmp_path, hosts=1)
    (job,) = submit(master_server, [{"name": "chatty", "command": command, "meta_hosts": [[shard.label, 1]]}])
    context = chromium.new_context()
    context.set_default_timeout(30_000)
    page = context.new_page()
    shard.process.start()
    try:
        login(page, master_server.url, user, f"/admin/common/job/{job}/change/")
        box = page.locator(".fs-live-log")
        expect(box.locator(".fs-log-note")).to_contain_text("live: Running")
        # The page's reads are held until the job has ended and its whole log is on the master, so
        # that the page must catch up in several reads (a read brings at most 1 MiB) after the end.
        held: list[Any] = []
        passing = False
        page.route(lambda url: "/log?" in url, lambda route: route.continue_() if passing else held.append(route))
        until_held(page, held)
        go.touch()
        status = f"{master_server.url}{box.get_attribute('data-url')}?hqe={box.get_attribute('data-hqe')}&limit=0"
        wait_until(lambda: context.request.get(status).json()["ended"], timeout=60, what="the log ended")
        held.pop().continue_()
        until_held(page, held)
        # The first catching-up read said the log ended, but more of it is still to come.
        assert box.get_attribute("data-state") == "live"
        passing = True
        held.pop().continue_()
        expect(box).to_have_attribute("data-state", "ended", timeout=60_000)
        shown = page.locator(".fs-live-log pre.fs-live").evaluate("pre => pre.textContent")
        assert 400_000 < len(shown) <= 512 * 1024, len(shown)
        assert set(shown.splitlines()) == {"x" * 99}, "whole lines only"
        expect(page.locator(".fs-live-log .fs-log-note")).to_contain_text("Earlier output is not shown")
    finally:
        context.close()
        shard.process.stop()
    wait_until(lambda: shard.process.proc is not None and shard.process.proc.poll() is not None, what="shard stop")
