"""The Benchmarks pages in a real browser: from the admin's front page to a test, its entries, and a
chart of one entry drawn by the vendored uPlot (served by the master itself: no network), with two
board labels, a regression marked, and a click on a point opening the run's job.

Saves docs/admin-benchmarks.png under `make screenshots`.
"""

import re
from typing import Any

import pytest

from tests.browser.test_admin_browser import screenshot
from tests.support import Master

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

USER, PASSWORD = "bench-operator", "fleetshard-bench-test"
TEST, ENTRY = "nightly <b>perf</b>", "BM_memcpy/4096"

WORLD = f"""
from datetime import UTC, datetime, timedelta
import json
from django.contrib.auth.models import User
from common.models import HostQueueEntry
from master import services
from master.results.ingest import store_result_file

User.objects.create_superuser({USER!r}, "bench@example.com", {PASSWORD!r})
services.create_labels(["board:kelpie", "board:oriole"], acting_user=None)
services.create_shard("bench-lab.example.com", ["board:kelpie", "board:oriole"], acting_user=None)
services.create_hosts(["kelpie-01"], acting_user=None, labels=["board:kelpie"])
services.create_hosts(["oriole-01"], acting_user=None, labels=["board:oriole"])

def hqe(host):
    job = services.create_job(services.JobRequest(
        name="bench-" + host, owner="ana", command="run-benchmarks", hosts=[host]), acting_user=None)
    return HostQueueEntry.objects.get(job=job)

def upload(test, when, hqe_, values):
    entries = [{{"name": n, "iters": 100, "wallTime": v, "cpuTime": v}} for n, v in values.items()]
    doc = {{"name": test, "startTime": when.timestamp(), "entries": {{"entry": entries}}}}
    store_result_file(json.dumps(doc).encode(), "bench.json", hqe=hqe_, acting_user=None)

t0 = datetime(2026, 3, 1, tzinfo=UTC)
kelpie, oriole = hqe("kelpie-01"), hqe("oriole-01")
for i in range(40):
    noise = 1 + 0.01 * ((i * 7) % 5 - 2)
    level = 2.0e-6 if i < 28 else 2.5e-6
    upload({TEST!r}, t0 + timedelta(hours=6 * i), kelpie, {{{ENTRY!r}: level * noise, "BM_sort": 1e-3}})
    upload({TEST!r}, t0 + timedelta(hours=6 * i + 3), oriole, {{{ENTRY!r}: 3.1e-6 * noise}})
import time
from master.models import DirtySeries, Regression
from master.results.detection import drain
drain()
for _ in range(300):  # a series the master's own detector claimed first is its to finish
    if not DirtySeries.objects.exists():
        break
    time.sleep(0.1)
step = Regression.objects.get(test={TEST!r}, entry={ENTRY!r})
result = {{"kelpie_job": kelpie.job_id, "oriole_job": oriole.job_id, "change_pct": round(step.change_pct, 2),
           "start": f"{{step.start:%Y-%m-%d %H:%M:%S}}"}}
"""


@pytest.fixture(scope="module")
def bench_world(master_server: Master) -> dict[str, Any]:
    return master_server.shell(WORLD)


@pytest.fixture
def page(chromium: Any, master_server: Master) -> Any:
    context = chromium.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(20_000)
    page = context.new_page()
    page.goto(master_server.url + "/admin/")
    page.fill("#id_username", USER)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(master_server.url + "/admin/")
    yield page
    context.close()


def test_from_the_front_page_to_a_chart_of_two_boards_with_a_regression_and_a_click_to_the_job(
    master_server: Master, bench_world: dict[str, Any], page: Any
) -> None:
    from playwright.sync_api import expect

    failed: list[str] = []
    page.on("pageerror", lambda exc: failed.append(str(exc)))
    page.on("requestfailed", lambda req: failed.append(req.url))

    page.click("#fs-benchmarks-link a")
    expect(page.locator("h1")).to_have_text("Benchmarks")
    page.get_by_role("link", name=TEST).click()  # the name's markup shows as text
    expect(page.locator("h1")).to_have_text(TEST)
    page.get_by_role("link", name=ENTRY).click()
    expect(page.locator("h1")).to_have_text(f"{TEST} / {ENTRY}")
    page.wait_for_function("window.fsChart !== undefined")

    labels = page.evaluate("fsChart.series.map(s => s.label)")
    assert labels == ["start", "board:kelpie", "board:oriole"]
    assert page.evaluate("fsChart.data.map(d => d.filter(v => v != null).length)") == [80, 40, 40]
    legend = page.locator("#fs-chart .u-legend")
    expect(legend).to_contain_text("board:kelpie")
    expect(legend).to_contain_text("board:oriole")
    # The regression on kelpie is drawn at its start, and listed under the chart.
    markers = page.evaluate("fsChart.fsMarkers.map(r => [r.label, r.status, r.change_pct])")
    assert markers == [["board:kelpie", "new", bench_world["change_pct"]]]
    assert bench_world["start"] == "2026-03-08 00:00:00"  # the first slow run: the 29th, 6 hours apart
    expect(page.locator("#fs-regressions .fs-regression")).to_have_count(1)
    expect(page.locator("#fs-regressions")).to_contain_text(bench_world["start"])
    # The canvas holds the drawing: many painted pixels in each series' color.
    painted = page.evaluate(
        """() => {
          const c = fsChart.ctx.canvas, px = fsChart.ctx.getImageData(0, 0, c.width, c.height).data;
          let blue = 0, red = 0;
          for (let i = 0; i < px.length; i += 4) {
            if (px[i] == 0x15 && px[i + 1] == 0x65 && px[i + 2] == 0xc0) blue++;
            if (px[i] == 0xc6 && px[i + 1] == 0x28 && px[i + 2] == 0x28) red++;
          }
          return [c.width > 400 && c.height > 300, blue > 500, red > 500];
        }"""
    )
    assert painted == [True, True, True]
    assert failed == []

    screenshot(page, "admin-benchmarks.png")
    page.wait_for_function("window.fsChart !== undefined")

    # Hover then click an oriole point: the page names its run, then opens its job.
    x, y = page.evaluate(
        """() => {
          const u = fsChart, ys = u.data[2];
          let i = Math.floor(ys.length / 2);
          while (ys[i] == null) i++;
          const box = u.over.getBoundingClientRect();
          return [box.left + u.valToPos(u.data[0][i], "x"), box.top + u.valToPos(ys[i], "y")];
        }"""
    )
    page.mouse.move(x - 30, y + 30)
    page.mouse.move(x, y, steps=5)
    expect(page.locator("#fs-chart-hover")).to_contain_text("board:oriole")
    expect(page.locator("#fs-chart-hover")).to_contain_text("oriole-01")
    page.mouse.click(x, y)
    job = bench_world["oriole_job"]
    page.wait_for_url(re.compile(re.escape(f"{master_server.url}/admin/common/job/{job}/change/") + "$"))
    expect(page.locator("#content")).to_contain_text("bench-oriole-01")
