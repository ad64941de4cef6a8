"""The admin in a real browser: a real master (gunicorn) and a real `run_shard` heartbeating to it.

The world is made through master.services in the master's own Django (Master.shell). The overview
and shard-list tests save the screenshots that docs/features.md shows (`make screenshots` writes docs/admin-*.png).
"""

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support import ROOT, Master, ShardProcess, free_port, make_shard_process, stop, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

# `make screenshots` points this at docs/ to refresh docs/features.md's pictures; a plain test run keeps
# its pictures under var/ so it never changes tracked files.
SHOTS = Path(os.environ.get("FLEETSHARD_SCREENSHOTS_DIR") or ROOT / "var" / "screenshots")
USER, PASSWORD = "operator", "fleetshard-ui-test"
LIVE, OFFLINE = "mtv-lab1.example.com", "lon-lab2.example.com"

WORLD = f"""
from django.contrib.auth.models import User
from master import services

User.objects.create_superuser({USER!r}, "operator@example.com", {PASSWORD!r})
services.create_labels(["board:sunfish", "board:bramble", "pool:ui-bvt"], acting_user=None)
_, token = services.create_shard({LIVE!r}, ["board:sunfish"], acting_user=None)
services.create_shard({OFFLINE!r}, ["board:bramble"], acting_user=None)
services.create_hosts(["sunfish-01", "sunfish-02"], acting_user=None, labels=["board:sunfish", "pool:ui-bvt"])
services.create_hosts(["sunfish-03"], acting_user=None, labels=["board:sunfish"], attributes={{"serial": "SF03"}})
services.create_hosts(
    ["sunfish-04"], acting_user=None, labels=["board:sunfish"], locked=True, lock_reason="usb hub replaced"
)
services.create_hosts(["bramble-01", "bramble-02"], acting_user=None, labels=["board:bramble", "pool:ui-bvt"])
# A locked host gets no work, so this job stays queued on the shard until it is aborted.
parked = services.create_job(services.JobRequest(
    name="ui-bvt-parked", owner="ana", command="sleep 600", hosts=["sunfish-04"]), acting_user=None)
services.create_job(services.JobRequest(
    name="bramble-smoke", owner="ana", command="true", meta_hosts=[("board:bramble", 2)]), acting_user=None)

# A day of history on the live shard, for the utilisation table: runs of ended jobs (never sent to
# the shard), each followed by cleaning, and one repair.
from datetime import timedelta
from django.utils import timezone
from common.models import Host, HostQueueEntry, Job
from master.timeline.models import Interval
now = timezone.now()
Host.objects.update(created_on=now - timedelta(days=2))  # the history below is theirs: they existed then
for n, (hostname, ago_h, run_h) in enumerate([("sunfish-01", 20, 3), ("sunfish-02", 12, 5), ("sunfish-03", 6, 2)]):
    host = Host.objects.get(hostname=hostname)
    start = now - timedelta(hours=ago_h)
    end = start + timedelta(hours=run_h)
    job = Job.objects.create(name=f"nightly-{{n}}", owner="ana", command="true", shard=host.shard,
                             status="Completed", created_on=start - timedelta(minutes=20 * (n + 1)))
    hqe = HostQueueEntry.objects.create(job=job, host=host, status="Completed", exit_code=0,
                                        started_on=start, finished_on=end)
    Interval.objects.create(kind="run", host=host, shard=host.shard, job=job, hqe=hqe, start=start, end=end)
    after = "Repairing" if n == 1 else "Cleaning"
    Interval.objects.create(kind=after, host=host, shard=host.shard, start=end, end=end + timedelta(minutes=30))
result = {{"token": token, "parked": parked.id}}
"""


@dataclass
class World:
    master: Master
    shard: ShardProcess
    parked_job: int

    def master_value(self, code: str) -> Any:
        return self.master.shell(code)


@pytest.fixture(scope="module")
def world(master_server: Master, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    made = master_server.shell(WORLD)
    shard = make_shard_process(tmp_path_factory.mktemp("browser"), master_server, LIVE, made["token"])
    shard.start()
    try:
        wait_until(
            lambda: master_server.shell(
                f"from common.models import Shard\nresult = Shard.objects.get(hostname={LIVE!r}).is_online()"
            ),
            timeout=60,
            interval=1,
            what=f"{LIVE} to heartbeat",
        )
        yield World(master_server, shard, made["parked"])
    finally:
        shard.stop()


@pytest.fixture(scope="module")
def session_state(world: World, chromium: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Logs in once through the login form; later tests reuse the session cookie."""
    context = chromium.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    login(page, world.master.url, "/admin/")
    path = str(tmp_path_factory.mktemp("browser-state") / "state.json")
    context.storage_state(path=path)
    context.close()
    return path


@pytest.fixture
def page(chromium: Any, session_state: str) -> Iterator[Any]:
    context = chromium.new_context(viewport={"width": 1280, "height": 860}, storage_state=session_state)
    context.set_default_timeout(20_000)
    page = context.new_page()
    yield page
    context.close()


def login(page: Any, base: str, next_path: str) -> None:
    page.goto(base + next_path)
    assert "/admin/login/" in page.url
    page.fill("#id_username", USER)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(re.escape(base + next_path) + r"$"))


def pick_action(page: Any, base: str, changelist: str, search: str, action: str) -> None:
    """Searches a changelist for one row, ticks it, and runs `action` on it."""
    page.goto(f"{base}/admin/common/{changelist}/?q={search}")
    boxes = page.locator("input[name=_selected_action]")
    assert boxes.count() == 1, page.content()[:3000]
    boxes.first.check()
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")


def screenshot(page: Any, name: str) -> None:
    """Saves a docs/features.md picture: a wide window with the admin's navigation sidebar folded away."""
    page.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    page.set_viewport_size({"width": 1440, "height": 760})
    page.reload()
    page.wait_for_load_state("networkidle")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / name), full_page=True)


def test_login_and_the_fleet_overview_shows_the_shard_online(world: World, chromium: Any) -> None:
    from playwright.sync_api import expect

    context = chromium.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(20_000)
    page = context.new_page()
    try:
        login(page, world.master.url, "/admin/fleet/")
        live = page.locator(f'#fs-shards tr[data-shard="{LIVE}"]')
        expect(live.locator(".fs-state")).to_have_text("online")
        expect(live).to_contain_text("4 hosts")
        expect(live).to_contain_text("4 Ready")
        expect(live).to_contain_text("1 locked")
        expect(live).to_contain_text("0.1.0")
        offline = page.locator(f'#fs-shards tr[data-shard="{OFFLINE}"]')
        expect(offline.locator(".fs-state")).to_have_text("offline")
        expect(offline.locator(".fs-age")).to_have_text("never")
        # Worst first: the shard never heard from is listed above the one online. The master is the
        # session's, so other tests' shards (some late by now) are in the list and the totals too.
        order = page.locator("#fs-shards tbody tr").evaluate_all("rows => rows.map(r => r.dataset.shard)")
        assert order.index(OFFLINE) < order.index(LIVE), order
        expect(page.locator("#fs-late")).to_have_text(re.compile(r"^\d+ late$"))
        expect(page.locator("#fs-never")).to_have_text(re.compile(r"^[1-9]\d* never seen$"))
        expect(page.locator('tr[data-label="board:sunfish"] .fs-ready')).to_have_text("3 of 4")
        expect(page.locator('tr[data-label="pool:ui-bvt"] .fs-ready')).to_have_text("4 of 4")
        # 10 h of runs on 4 hosts over 24 h
        expect(page.locator(f'#fs-utilisation tr[data-shard="{LIVE}"] .fs-util')).to_have_text("10%")
        # It refreshes itself: the time it was drawn changes without anyone reloading it.
        drawn = page.locator("#fs-summary").inner_text()
        expect(page.locator("#fs-summary")).not_to_have_text(drawn, timeout=15_000)
        expect(live.locator(".fs-state")).to_have_text("online")
        screenshot(page, "admin-overview.png")
        # The search narrows the list to the shards whose name contains it.
        page.fill('#fs-search input[name="q"]', LIVE)
        page.click('#fs-search input[type="submit"]')
        expect(page.locator("#fs-shards tbody tr")).to_have_count(1)
        expect(page.locator("#fs-shards tbody tr").first).to_have_attribute("data-shard", LIVE)
    finally:
        context.close()


def test_shard_list_shows_online_offline_heartbeat_hosts_and_jobs(world: World, page: Any) -> None:
    from playwright.sync_api import expect

    page.goto(world.master.url + "/admin/common/shard/")
    live = page.locator("#result_list tr", has_text=LIVE)
    expect(live.locator(".field-state")).to_have_text("online")
    expect(live.locator(".field-heartbeat")).to_contain_text("s ago")
    expect(live.locator(".field-client_version")).to_have_text("0.1.0")
    expect(live.locator(".field-hosts_by_status")).to_contain_text("4 total")
    expect(live.locator(".field-jobs_queued")).to_have_text("1")
    dead = page.locator("#result_list tr", has_text=OFFLINE)
    expect(dead.locator(".field-state")).to_have_text("offline")
    expect(dead.locator(".field-heartbeat")).to_have_text("never")
    screenshot(page, "admin-shards.png")


def test_lock_a_host_with_a_reason(world: World, page: Any) -> None:
    from playwright.sync_api import expect

    pick_action(page, world.master.url, "host", "sunfish-02", "lock_hosts")
    expect(page.locator("h1")).to_have_text("Lock hosts")
    page.fill("#id_fs-reason", "replacing the USB hub")
    page.click("input[value=Lock]")
    expect(page.locator(".messagelist")).to_contain_text("Locked host sunfish-02: replacing the USB hub")
    expect(page.locator("#result_list tr", has_text="sunfish-02")).to_contain_text("replacing the USB hub")
    host = world.master_value(
        "from common.models import Host\nh = Host.objects.get(hostname='sunfish-02')\n"
        "result = [h.locked, h.lock_reason]"
    )
    assert host == [True, "replacing the USB hub"]
    # The lock is master-owned config: the shard receives it on its next heartbeat.
    wait_for_the_shard_to_hold_the_lock(world)


def wait_for_the_shard_to_hold_the_lock(world: World) -> None:
    wait_until(
        lambda: (
            world.shard.shell(
                "from common.models import Host\n"
                "result = list(Host.objects.filter(hostname='sunfish-02').values_list('locked', 'lock_reason'))"
            )
            == [[True, "replacing the USB hub"]]
        ),
        timeout=30,
        interval=1,
        what="the lock to reach the shard",
    )


@pytest.fixture(scope="module")
def shard_admin(world: World) -> Iterator[str]:
    """The shard's own admin, served by `manage.py serve` in the shard's role, on its database."""
    world.shard.shell(
        "from django.contrib.auth.models import User\n"
        f"User.objects.create_superuser({USER!r}, 'lab@example.com', {PASSWORD!r})\nresult = True"
    )
    port = free_port()
    proc = world.shard.role.start("serve", "--bind", f"127.0.0.1:{port}", "--workers", "1", log_name="admin.log")
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError("the shard's admin exited:\n" + (world.shard.role.data_dir / "admin.log").read_text())
        try:
            return requests.get(base + "/admin/login/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    wait_until(up, timeout=60, what="the shard's admin to serve")
    yield base
    stop(proc)


def test_the_shard_admin_shows_its_hosts_and_queue_read_only(world: World, shard_admin: str, chromium: Any) -> None:
    from playwright.sync_api import expect

    # sunfish-02 locked as test_lock_a_host_with_a_reason leaves it, which pytest-xdist may have run
    # in another worker (another world) or not at all.
    world.master_value(
        "from common.models import Host\nfrom master import services\n"
        "if not Host.objects.get(hostname='sunfish-02').locked:\n"
        "    services.lock_hosts(['sunfish-02'], 'replacing the USB hub', acting_user=None)\n"
        "result = True"
    )
    wait_for_the_shard_to_hold_the_lock(world)
    context = chromium.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(20_000)
    page = context.new_page()
    try:
        login(page, shard_admin, "/admin/")
        summary = page.locator("#fs-shard-summary")
        expect(summary).to_contain_text(f"Shard {LIVE}")
        expect(summary).to_contain_text("4 Ready")
        expect(summary).to_contain_text("2 locked")
        expect(summary).to_contain_text("1 queued, 0 starting, 0 running")
        page.goto(shard_admin + "/admin/common/host/")
        parked = page.locator("#result_list tr", has_text="sunfish-04")
        expect(parked).to_contain_text("usb hub replaced")
        expect(parked.locator(".field-status_badge")).to_have_text("Ready")
        expect(page.locator("#result_list tr", has_text="sunfish-02")).to_contain_text("replacing the USB hub")
        assert page.locator("select[name=action]").count() == 0  # no actions: nothing changes here
        page.goto(shard_admin + "/admin/common/job/")
        expect(page.locator("#result_list")).to_contain_text("ui-bvt-parked")
        expect(page.locator("#result_list")).not_to_contain_text("bramble-smoke")  # another shard's job
        page.goto(shard_admin + "/admin/")
        screenshot(page, "admin-shard-site.png")
    finally:
        context.close()


def hqe_statuses(world: World, job_id: int) -> list[str]:
    return world.master_value(
        f"from common.models import HostQueueEntry\n"
        f"result = list(HostQueueEntry.objects.filter(job_id={job_id}).values_list('status', flat=True))"
    )


def abort_job_in_browser(world: World, page: Any, name: str, job_id: int) -> None:
    from playwright.sync_api import expect

    pick_action(page, world.master.url, "job", name, "abort_jobs")
    expect(page.locator("h1")).to_have_text("Abort jobs")
    page.click("input[value='Yes, abort them']")
    expect(page.locator(".messagelist")).to_contain_text(f"Aborting job {job_id}")


def test_abort_a_queued_job_reaches_the_shard(world: World, page: Any) -> None:
    wait_until(
        lambda: world.shard.shell(
            f"from common.models import Job\nresult = Job.objects.filter(id={world.parked_job}).exists()"
        ),
        timeout=30,
        interval=1,
        what="the shard to hold the job",
    )
    abort_job_in_browser(world, page, "ui-bvt-parked", world.parked_job)
    wait_until(
        lambda: hqe_statuses(world, world.parked_job) == ["Aborted"],
        timeout=30,
        interval=1,
        what="the shard to report the HQE Aborted",
    )
    page.goto(f"{world.master.url}/admin/common/job/{world.parked_job}/change/")
    from playwright.sync_api import expect

    expect(page.locator(".form-row.field-status_badge .readonly")).to_have_text("Aborted")


def test_abort_a_running_job_reaches_the_shard(world: World, page: Any, shard_admin: str, chromium: Any) -> None:
    from playwright.sync_api import expect

    job_id = world.master_value(
        "from master import services\n"
        "result = services.create_job(services.JobRequest(name='ui-long-run', owner='ana', "
        "command='echo flashing build R120; sleep 600', hosts=['sunfish-03']), acting_user=None).id"
    )
    wait_until(
        lambda: hqe_statuses(world, job_id) == ["Running"],
        timeout=90,
        interval=1,
        what="the shard to run the job and report it Running",
    )
    # The lab's operator sees the run and its live log tail in the shard's own admin (its own
    # browser context: both servers are on 127.0.0.1, and cookies do not tell ports apart).
    lab = chromium.new_context(viewport={"width": 1280, "height": 860})
    lab.set_default_timeout(20_000)
    try:
        lab_page = lab.new_page()
        login(lab_page, shard_admin, "/admin/common/hostqueueentry/?activity=active")
        running = lab_page.locator("#result_list tr", has_text="ui-long-run")
        expect(running.locator(".field-status_badge")).to_have_text("Running")
        expect(running.locator(".field-log_lines")).to_contain_text("flashing build R120")
    finally:
        lab.close()
    abort_job_in_browser(world, page, "ui-long-run", job_id)
    wait_until(
        lambda: hqe_statuses(world, job_id) == ["Aborted"],
        timeout=90,
        interval=1,
        what="the shard to kill the job and report it Aborted",
    )


# The lists at 1400 px, as a lab engineer first opens them: every column in view, names on one line,
# no red cross for a normal state, seconds on times, and no link that leads to a 404.
LISTS = ["/admin/common/job/", "/admin/common/host/", "/admin/common/shard/"]


@pytest.fixture
def wide(chromium: Any, session_state: str) -> Iterator[Any]:
    context = chromium.new_context(viewport={"width": 1400, "height": 900}, storage_state=session_state)
    context.set_default_timeout(20_000)
    page = context.new_page()
    yield page
    context.close()


CLIPPED = """() => {
    const table = document.querySelector('#result_list');
    const right = document.documentElement.clientWidth;
    const cells = [...table.querySelectorAll('thead th')];
    const out = cells.filter(c => c.getBoundingClientRect().right > right + 1).map(c => c.innerText.trim());
    const scroller = table.closest('.results');
    if (scroller && scroller.scrollWidth > scroller.clientWidth + 1) {
        const widths = cells.map(c => c.innerText.trim() + ' ' + Math.round(c.getBoundingClientRect().width));
        out.push('(the list scrolls sideways: ' + scroller.scrollWidth + ' > ' + scroller.clientWidth + '; '
                 + widths.join(', ') + ')');
    }
    return out;
}"""

TALL_NAMES = """() => [...document.querySelectorAll('#result_list td.field-name, #result_list th.field-name')]
    .filter(c => c.getBoundingClientRect().height > 2 * parseFloat(getComputedStyle(c).lineHeight || 16) + 12)
    .map(c => c.innerText)"""


@pytest.mark.parametrize("path", LISTS)
def test_the_lists_show_every_column_at_1400_px_without_red_crosses(world: World, wide: Any, path: str) -> None:
    wide.goto(world.master.url + path)
    assert wide.locator("#result_list").count() == 1, wide.content()[:2000]
    assert wide.evaluate(CLIPPED) == [], f"{path}: clipped columns"
    assert wide.evaluate(TALL_NAMES) == [], f"{path}: names wrapped over lines"
    crosses = wide.locator("#result_list img[src*='icon-no']")
    assert crosses.count() == 0, f"{path}: a red cross for a normal state (not aborted, not locked)"


def test_times_have_seconds_and_no_link_leads_to_a_404(world: World, wide: Any) -> None:
    base = world.master.url
    wide.goto(base + "/admin/common/job/")
    created = wide.locator("#result_list td.field-created_on").first.inner_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", created.strip()), created
    wide.goto(f"{base}/admin/common/job/{world.parked_job}/change/")
    page_text = wide.locator("#content").inner_text()
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", page_text), page_text[:1000]
    cookies = {c["name"]: c["value"] for c in wide.context.cookies()}
    hrefs = wide.evaluate("() => [...document.querySelectorAll('#header a, #user-tools a')].map(a => a.href)")
    for href in hrefs:
        if href.startswith(base) and "logout" not in href:
            status = requests.get(href, cookies=cookies, timeout=10, allow_redirects=True).status_code
            assert status == 200, f"{href}: {status}"
