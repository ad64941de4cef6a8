"""The master's admin: pages, actions through the services, add pages, tokens, read-only objects."""

import json
import re
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.test import Client

from common.models import Host, Job, Label, Shard
from master import services
from master.access.credentials import digest_of, find_token
from master.models import AuditRecord, Token
from master.results.ingest import store_result_file
from tests.master.results.test_formats import TF_SAMPLE
from tests.support import assert_status


def host(name: str) -> Host:
    return Host.objects.get(hostname=name)


def url(model: str, view: str = "changelist") -> str:
    app = "master" if model == "token" else "common"
    return f"/admin/{app}/{model}/" + ("" if view == "changelist" else f"{view}/")


def messages_of(resp: Any) -> list[str]:
    return [str(m) for m in get_messages(resp.wsgi_request)]


def run_action(client: Client, model: str, action: str, ids: list[int], **fields: str) -> Any:
    """Picks an action on the changelist, then submits its intermediate form (if any) with `fields`."""
    data: dict[str, Any] = {"action": action, ACTION_CHECKBOX_NAME: [str(i) for i in ids], "index": "0"}
    first = client.post(url(model), data)
    if first.status_code != 200:
        return client.get(first.url) if first.status_code == 302 else first
    assert "fs-action-form" in first.content.decode(), first.content.decode()[:2000]
    form = {**data, "fs_apply": "yes", **{f"fs-{k}": v for k, v in fields.items()}}
    resp = client.post(url(model), form, follow=True)
    assert_status(resp, 200)
    return resp


@pytest.fixture
def staff(db: None) -> Client:
    user = User.objects.create_superuser("op", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("model", ["label", "host", "shard", "job", "token"])
def test_changelists_and_add_pages_render(fleet, staff, model):
    fleet.job()
    resp = staff.get(url(model))
    assert_status(resp, 200)
    resp = staff.get(url(model, "add"))
    assert_status(resp, 200)


def test_host_list_shows_status_badges_labels_and_filters(fleet, staff):
    services.lock_hosts(["a2"], "flaky usb", acting_user=None)
    page = staff.get(url("host")).content.decode()
    assert 'class="fs-badge"' in page and ">Ready</span>" in page
    assert "flaky usb" in page and "board:a, wifi" in page
    for param in ("status__exact=Ready", "locked__exact=1", 'name="labels__id__exact"', 'name="shard__id__exact"'):
        assert param in page
    locked = staff.get(url("host") + "?locked__exact=1").context["cl"]
    assert [h.hostname for h in locked.result_list] == ["a2"]
    searched = staff.get(url("host") + "?q=b1").context["cl"]
    assert [h.hostname for h in searched.result_list] == ["b1"]
    by_label = staff.get(url("host") + f"?labels__id__exact={Label.objects.get(name='wifi').id}").context["cl"]
    assert sorted(h.hostname for h in by_label.result_list) == ["a1", "a2", "b1"]


def test_shard_and_label_filters_are_one_select_each_keeping_the_other_parameters(fleet, staff):
    """Hundreds of shards and labels: a <select> in a GET form each, not a link a choice."""
    wifi = Label.objects.get(name="wifi")
    resp = staff.get(url("host") + f"?labels__id__exact={wifi.id}&q=a&o=2")
    page = resp.content.decode()
    shard_form = page[page.index('data-filter-title="shard"') :].split("</details>")[0]
    assert f'<input type="hidden" name="labels__id__exact" value="{wifi.id}">' in shard_form
    assert '<input type="hidden" name="q" value="a">' in shard_form and 'name="o" value="2"' in shard_form
    assert f'<option value="{fleet.lab1.id}">lab1</option>' in shard_form
    label_form = page[page.index('data-filter-title="labels"') :].split("</details>")[0]
    assert f'<option value="{wifi.id}" selected>wifi</option>' in label_form
    assert 'name="labels__id__exact"' not in label_form.split("<select")[0]  # not hidden: the select sets it
    assert '<a href="?o=2&amp;q=a">All</a>' in label_form and "labels__isnull=True" in label_form
    assert sorted(h.hostname for h in resp.context["cl"].result_list) == ["a1", "a2"]
    jobs = staff.get(url("job") + "?label=wifi").content.decode()
    assert '<option value="wifi" selected>wifi</option>' in jobs and 'name="shard__id__exact"' in jobs


def test_job_list_filters_by_status_shard_and_label_and_searches_names(fleet, staff):
    fleet.job("smoke")
    fleet.job("perf", meta_hosts=[("board:b", 1)])
    by_shard = staff.get(url("job") + f"?shard__id__exact={fleet.lab2.id}").context["cl"]
    assert [j.name for j in by_shard.result_list] == ["perf"]
    by_label = staff.get(url("job") + "?label=board:a").context["cl"]
    assert [j.name for j in by_label.result_list] == ["smoke"]
    assert [j.name for j in staff.get(url("job") + "?q=perf").context["cl"].result_list] == ["perf"]
    assert staff.get(url("job") + "?status__exact=Running").context["cl"].result_count == 0


def test_job_page_shows_hqes_inline_read_only(fleet, staff):
    job = fleet.job(meta_hosts=[("board:a", 2)])
    page = staff.get(url("job", f"{job.id}/change")).content.decode()
    assert page.count("Queued</span>") >= 2
    assert 'name="_save"' not in page and "hqes-TOTAL_FORMS" in page
    assert_status(staff.post(url("job", f"{job.id}/change"), {"name": "renamed"}), 403)
    assert Job.objects.get(id=job.id).name == "smoke"


def test_object_pages_are_read_only(fleet, staff):
    page = staff.get(url("host", f"{host('a1').id}/change")).content.decode()
    form = page.split('id="content-main"')[1].split("</form>")[0]
    assert 'name="_save"' not in page and not re.search(r'<(input(?! type="hidden")|select|textarea)', form)
    assert_status(staff.post(url("host", f"{host('a1').id}/change"), {"locked": "on"}), 403)
    assert not host("a1").locked
    assert_status(staff.get(url("host", f"{host('a1').id}/delete")), 403)


def test_lock_action_asks_for_a_reason_and_locks_through_the_service(fleet, staff):
    v1, v2 = host("a1").version, host("b1").version
    first = staff.post(url("host"), {"action": "lock_hosts", ACTION_CHECKBOX_NAME: [host("a1").id, host("b1").id]})
    assert_status(first, 200)
    page = first.content.decode()
    assert 'name="fs-reason"' in page and "a1" in page and "b1" in page
    assert not host("a1").locked
    resp = run_action(staff, "host", "lock_hosts", [host("a1").id, host("b1").id], reason="rack 4 power work")
    assert "locked hosts a1, b1: rack 4 power work" in messages_of(resp)
    for name, version in (("a1", v1), ("b1", v2)):
        h = host(name)
        assert h.locked and h.lock_reason == "rack 4 power work" and h.version == version + 1


def test_unlock_action(fleet, staff):
    services.lock_hosts(["a1"], "x", acting_user=None)
    resp = run_action(staff, "host", "unlock_hosts", [host("a1").id])
    assert "unlocked host a1" in messages_of(resp)
    assert not host("a1").locked and host("a1").lock_reason == ""


def test_adding_a_label_owned_by_another_shard_shows_the_service_error_and_changes_nothing(fleet, staff):
    resp = run_action(staff, "shard", "add_labels", [fleet.lab2.id], labels="board:a")
    assert messages_of(resp) == ["label board:a already belongs to shard lab1"]
    assert Label.objects.get(name="board:a").shard == fleet.lab1
    assert host("a1").shard == fleet.lab1


def test_shard_label_actions(fleet, staff):
    resp = run_action(staff, "shard", "add_labels", [fleet.lab2.id], labels="board:c")
    assert messages_of(resp) == ["shard lab2 now owns label board:c; host c1 joined shard lab2"]
    assert host("c1").shard == fleet.lab2
    resp = run_action(staff, "shard", "remove_label", [fleet.lab2.id], label="board:c")
    assert messages_of(resp) == ["removed label board:c from shard lab2; host c1 left shard lab2"]
    assert host("c1").shard is None


def test_shard_actions_need_exactly_one_shard(fleet, staff):
    resp = run_action(staff, "shard", "add_labels", [fleet.lab1.id, fleet.lab2.id])
    assert messages_of(resp) == ["select exactly one shard for this action"]


def test_host_label_action_refuses_two_shards_with_the_service_message(fleet, staff):
    resp = run_action(staff, "host", "add_label", [host("a1").id], label="board:b")
    assert messages_of(resp) == [
        "host a1 would have labels of two shards: board:a (shard lab1) and board:b (shard lab2)"
    ]
    assert sorted(host("a1").labels.values_list("name", flat=True)) == ["board:a", "wifi"]
    resp = run_action(staff, "host", "add_label", [host("c1").id], label="pool:x")
    assert "added label pool:x to host c1" in messages_of(resp)
    resp = run_action(staff, "host", "remove_label", [host("c1").id], label="pool:x")
    assert "removed label pool:x from host c1" in messages_of(resp)


def test_abort_action_aborts_through_the_service_and_refuses_finished_jobs(fleet, staff):
    job = fleet.job()
    resp = run_action(staff, "job", "abort_jobs", [job.id])
    assert any(m.startswith(f"aborting job {job.id}") for m in messages_of(resp))
    job.refresh_from_db()
    assert job.aborted and job.version == 2
    services.delete_shards(["lab1"], acting_user=None)  # ends the job Aborted
    resp = run_action(staff, "job", "abort_jobs", [job.id])
    assert messages_of(resp) == [f"job {job.id} (Aborted) already finished"]


def test_a_job_is_submitted_from_the_admin_with_the_command_lines_syntax(fleet, staff):
    form = {
        "name": "from-admin",
        "command": "echo hi",
        "meta_hosts": "board:a*2",
        "hosts": "",
        "dependency_labels": ["wifi"],
        "priority": "high",
        "timeout_mins": "60",
        "max_runtime_mins": "10",
        "keyvals": "build=7\n",
    }
    resp = staff.post(url("job", "add"), form)
    job = Job.objects.get(name="from-admin")
    assert resp.status_code == 302 and resp.url == f"/admin/common/job/{job.id}/change/"
    assert (job.owner, job.priority, job.keyvals, job.shard.hostname) == ("op", 70, {"build": "7"}, "lab1")
    assert sorted(h.meta_host.name for h in job.hqes.all()) == ["board:a", "board:a"]
    assert AuditRecord.objects.filter(action="job.create", user__username="op").exists()
    bad = staff.post(url("job", "add"), {**form, "name": "bad", "meta_hosts": "board:a*x"})
    assert bad.status_code == 200 and "invalid meta-host" in bad.content.decode()
    assert not Job.objects.filter(name="bad").exists()


def test_the_rerun_action_makes_a_new_job_of_the_same_spec(fleet, staff):
    job = fleet.job("nightly")
    resp = run_action(staff, "job", "rerun_job", [job.id])
    again = Job.objects.exclude(id=job.id).get()
    assert messages_of(resp) == [f"created job {again.id}, a rerun of job {job.id}"]
    assert (again.name, again.rerun_of_id, again.owner) == ("nightly", job.id, "op")


def test_the_job_page_links_its_results_to_the_chart(fleet, staff):
    job = fleet.job()
    hqe = job.hqes.get()
    store_result_file(json.dumps(TF_SAMPLE).encode(), "r.json", hqe=hqe, acting_user=None)
    page = staff.get(f"/admin/common/job/{job.id}/change/").content.decode()
    assert '<a href="/admin/benchmarks/entries/?test=adjust_contrast_benchmark">adjust_contrast_benchmark</a>' in page
    assert "(1 run, 2 entries)" in page


def test_delete_actions_go_through_the_services(fleet, staff):
    job = fleet.job(meta_hosts=[], hosts=["a1"])
    by_label = fleet.job()
    resp = run_action(staff, "host", "delete_hosts", [host("a1").id])
    assert messages_of(resp) == [f"host a1 has active job {job.id}; abort it first"]
    assert Host.objects.filter(hostname="a1").exists()
    resp = run_action(staff, "host", "delete_hosts", [host("c1").id])
    assert "deleted host c1" in messages_of(resp)
    resp = run_action(staff, "label", "delete_labels", [Label.objects.get(name="board:a").id])
    assert messages_of(resp) == [f"label board:a is used by active jobs {by_label.id}"]
    resp = run_action(staff, "shard", "delete_shards", [fleet.lab2.id])
    assert messages_of(resp) == ["deleted shard lab2; host b1 left shard lab2"]
    assert not Shard.objects.filter(hostname="lab2").exists() and host("b1").shard is None


def test_add_host_goes_through_the_service_and_shows_its_errors(fleet, staff):
    resp = staff.post(
        url("host", "add"),
        {
            "hostnames": "n1, n2",
            "labels": ["board:b"],
            "attributes": "serial=X1\n",
            "locked": "on",
            "lock_reason": "new",
        },
        follow=True,
    )
    assert "created hosts n1, n2" in messages_of(resp)
    n1 = host("n1")
    assert n1.shard == fleet.lab2 and n1.attributes == {"serial": "X1"} and n1.locked and n1.lock_reason == "new"
    resp = staff.post(url("host", "add"), {"hostnames": "n3", "labels": ["board:a", "board:b"]})
    assert_status(resp, 200)
    assert "host n3 would have labels of two shards" in resp.content.decode()
    assert not Host.objects.filter(hostname="n3").exists()
    resp = staff.post(url("host", "add"), {"hostnames": "n4", "attributes": "no-equals-sign"})
    assert "line 1: &#x27;no-equals-sign&#x27; is not KEY=VALUE" in resp.content.decode()


def test_add_label_goes_through_the_service(fleet, staff):
    resp = staff.post(url("label", "add"), {"names": "os:android os:ios"}, follow=True)
    assert "created labels os:android, os:ios" in messages_of(resp)
    resp = staff.post(url("label", "add"), {"names": "wifi"})
    assert "label wifi already exists" in resp.content.decode()


def test_label_list_shows_ready_of_total(fleet, staff, heartbeat):
    heartbeat(fleet.lab1, fleet.token1, known_hosts=[{"id": host("a1").id, "version": 1, "status": "Repairing"}])
    services.lock_hosts(["a2"], acting_user=None)
    rows = {label.name: label for label in staff.get(url("label")).context["cl"].result_list}
    assert (rows["board:a"].hosts_ready, rows["board:a"].hosts_total) == (1, 3)
    assert (rows["wifi"].hosts_ready, rows["wifi"].hosts_total) == (1, 3)


def test_create_shard_shows_its_token_once_and_stores_only_a_digest(db, staff, heartbeat):
    services.create_labels(["board:z"], acting_user=None)
    resp = staff.post(url("shard", "add"), {"hostname": "lab9", "labels": ["board:z"]})
    assert_status(resp, 200)
    assert "no-store" in resp["Cache-Control"]
    raw = re.search(r'<code id="fs-token"[^>]*>([^<]+)</code>', resp.content.decode()).group(1)
    shard = Shard.objects.get(hostname="lab9")
    token = Token.objects.get(shard=shard)
    assert token.digest == digest_of(raw) and raw not in (token.prefix, token.description)
    assert Label.objects.get(name="board:z").shard == shard
    heartbeat(shard, raw)  # the token shown is the shard's heartbeat credential
    page = staff.get(url("token", f"{token.id}/change")).content.decode()
    assert raw not in page and token.prefix in page
    assert raw not in staff.get(url("token")).content.decode()


def test_personal_token_and_revoke(db, staff):
    resp = staff.post(url("token", "add"), {"kind": "personal", "username": "ana", "description": "ci"})
    raw = re.search(r'<code id="fs-token"[^>]*>([^<]+)</code>', resp.content.decode()).group(1)
    token = find_token(raw)
    assert token is not None and token.user.username == "ana" and token.description == "ci"
    resp = run_action(staff, "token", "revoke_tokens", [token.id])
    assert "revoked 1 token" in messages_of(resp)
    assert find_token(raw) is None


def test_shard_token_for_an_existing_shard(fleet, staff, heartbeat):
    resp = staff.post(url("token", "add"), {"kind": "shard", "shard": "lab2"})
    raw = re.search(r'<code id="fs-token"[^>]*>([^<]+)</code>', resp.content.decode()).group(1)
    assert find_token(raw).shard == fleet.lab2
    heartbeat(fleet.lab2, raw)
    resp = staff.post(url("token", "add"), {"kind": "shard"})
    assert "a shard token needs a shard" in resp.content.decode()


def test_staff_without_superuser_only_create_their_own_plain_tokens(fleet):
    user = User.objects.create_user("staffer", password="pw", is_staff=True)
    from django.contrib.auth.models import Permission

    user.user_permissions.set(Permission.objects.filter(codename__in=["add_token", "view_token", "change_token"]))
    client = Client()
    client.force_login(user)
    resp = client.post(url("token", "add"), {"kind": "personal", "username": "staffer", "admin": "on"})
    assert "only a superuser can create an admin token" in resp.content.decode()
    User.objects.create_superuser("root", "r@example.com", "pw")
    resp = client.post(url("token", "add"), {"kind": "personal", "username": "root"})
    assert "only a superuser can create a token for another user" in resp.content.decode()
    resp = client.post(url("token", "add"), {"kind": "shard", "shard": "lab1"})
    assert "creating a shard token needs the permission to change shards" in resp.content.decode()
    assert not Token.objects.filter(user__username__in=["staffer", "root"]).exists()
    assert Token.objects.filter(shard__hostname="lab1").count() == 1
    resp = client.post(url("token", "add"), {"kind": "personal", "username": "staffer"})
    raw = re.search(r'<code id="fs-token"[^>]*>([^<]+)</code>', resp.content.decode()).group(1)
    assert find_token(raw).user == user and not User.objects.get(username="staffer").is_superuser


def test_admin_needs_staff(fleet):
    User.objects.create_user("plain", password="pw")
    client = Client()
    assert_status(client.get(url("host")), 302)
    client.login(username="plain", password="pw")
    assert_status(client.get(url("host")), 302)
    assert_status(client.get("/admin/fleet/"), 302)


def test_an_admin_action_records_the_admin_user(fleet, staff):
    run_action(staff, "host", "lock_hosts", [host("a1").id, host("a2").id], reason="bad battery")
    entry = AuditRecord.objects.order_by("-id").first()
    assert (entry.user.username, entry.action, entry.reason) == ("op", "host.lock", "bad battery")
    assert [(t.kind, t.name) for t in entry.targets.all()] == [("host", "a1"), ("host", "a2")]


def test_a_refused_admin_action_writes_no_record(fleet, staff):
    before = AuditRecord.objects.count()
    resp = run_action(staff, "shard", "add_labels", [fleet.lab1.id], labels=["board:b"])
    assert messages_of(resp) == ["label board:b already belongs to shard lab2"]
    assert AuditRecord.objects.count() == before and Label.objects.get(name="board:b").shard == fleet.lab2


def test_an_objects_history_page_shows_its_audit_trail_from_every_entry_point(fleet, staff):
    """Changes made elsewhere (here a service call as the API or the CLI would make it) show too."""
    services.lock_hosts(["a1"], "from the api", acting_user=User.objects.get(username="op"))
    run_action(staff, "host", "unlock_hosts", [host("a1").id])
    services.lock_hosts(["a2"], "not this host", acting_user=None)
    page = staff.get(url("host", f"{host('a1').id}/history")).content.decode()
    rows = re.findall(r"<tr>\s*<th scope=\"row\">[^<]*</th>(.*?)</tr>", page, re.S)
    cells = [[c.strip() for c in re.findall(r"<td>(.*?)</td>", row, re.S)] for row in rows]
    assert cells == [
        ["op", "host.unlock", "-", "host a1"],
        ["op", "host.lock", "from the api", "host a1"],
        ["system", "host.create", "-", "host a1, host a2, label board:a, label wifi"],
    ]


def test_a_history_page_shows_a_page_of_records_at_a_time(fleet, staff):
    """A shard's trail holds every job created on it: its history page must not render them all at once."""
    for n in range(130):
        services.lock_hosts(["a1"], f"r{n}", acting_user=None)

    def reasons(page: str) -> list[str]:
        return re.findall(r"<td>(r[0-9]+)</td>", page)

    first = staff.get(url("host", f"{host('a1').id}/history")).content.decode()
    assert reasons(first) == [f"r{n}" for n in range(129, 29, -1)]
    second = staff.get(url("host", f"{host('a1').id}/history") + "?p=2").content.decode()
    assert reasons(second) == [f"r{n}" for n in range(29, -1, -1)] and "host.create" in second
    assert "131 records" in first and "?p=2" in first


def test_the_audit_trail_is_read_only_in_the_admin(fleet, staff):
    services.lock_hosts(["a1"], "x", acting_user=None)
    entry = AuditRecord.objects.order_by("-id").first()
    page = staff.get("/admin/master/auditrecord/").content.decode()
    assert "host.lock" in page and "host a1" in page
    assert_status(staff.get(f"/admin/master/auditrecord/{entry.id}/change/"), 200)
    assert_status(staff.post(f"/admin/master/auditrecord/{entry.id}/delete/", {"post": "yes"}), 403)
    assert_status(staff.get("/admin/master/auditrecord/add/"), 403)
    assert AuditRecord.objects.filter(id=entry.id).exists()


def test_view_only_staff_sees_no_actions_and_cannot_run_them(fleet):
    from django.contrib.auth.models import Permission

    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
    client = Client()
    client.force_login(viewer)
    page = client.get(url("host")).content.decode()
    assert 'name="action"' not in page and 'href="/admin/common/host/add/"' not in page
    client.post(url("host"), {"action": "lock_hosts", ACTION_CHECKBOX_NAME: [host("a1").id], "fs_apply": "yes"})
    assert not host("a1").locked
    assert_status(client.get(url("host", "add")), 403)
    assert_status(client.get("/admin/fleet/"), 200)


def test_adding_a_shard_shows_its_token_so_it_needs_change_shard_too(fleet):
    from django.contrib.auth.models import Permission

    adder = User.objects.create_user("adder", password="pw", is_staff=True)
    adder.user_permissions.set(Permission.objects.filter(codename__in=["add_shard", "view_shard"]))
    client = Client()
    client.force_login(adder)
    assert_status(client.get(url("shard", "add")), 403)
    assert_status(client.post(url("shard", "add"), {"hostname": "lab9"}), 403)
    assert not Shard.objects.filter(hostname="lab9").exists()
    adder.user_permissions.add(Permission.objects.get(codename="change_shard"))
    client.force_login(User.objects.get(username="adder"))
    assert "fs-token" in client.post(url("shard", "add"), {"hostname": "lab9"}).content.decode()


def test_label_delete_action_says_which_hosts_left_which_shard(fleet, staff):
    services.create_labels(["board:x"], acting_user=None)
    services.add_labels_to_shard("lab1", ["board:x"], acting_user=None)
    services.create_hosts(["dut3"], labels=["board:x"], acting_user=None)
    resp = run_action(staff, "label", "delete_labels", [Label.objects.get(name="board:x").id])
    assert messages_of(resp) == ["deleted label board:x; host dut3 left shard lab1"]


def test_the_host_page_shows_the_running_job_and_the_last_runs(fleet, staff):
    from django.utils import timezone

    from common.constants import HQEStatus
    from common.models import HostQueueEntry

    done = fleet.job("done", hosts=["a1"], meta_hosts=[])
    now = fleet.job("now", hosts=["a1"], meta_hosts=[])
    HostQueueEntry.objects.filter(job=done).update(
        status=HQEStatus.FAILED, failure="test", exit_code=3, finished_on=timezone.now()
    )
    HostQueueEntry.objects.filter(job=now).update(status=HQEStatus.RUNNING)
    page = staff.get(url("host", f"{Host.objects.get(hostname='a1').id}/change")).content.decode()
    running = HostQueueEntry.objects.get(job=now).id
    assert f'<a href="/admin/common/job/{now.id}/change/">job {now.id} (now)</a>, entry {running}: Running' in page
    assert f"job {done.id} (done)</a>, entry" in page and ": Failed (test, exit 3), ended " in page
    idle = staff.get(url("host", f"{Host.objects.get(hostname='a2').id}/change")).content.decode()
    assert "nothing" in idle and "none yet" in idle


def test_shard_list_sorts_by_host_count_listing_each_shard_once(fleet, staff):
    """The "hosts by status" column sorts by the count: not by a joined host's name (the reverse
    relation Shard.hosts), which listed a shard once per host."""
    services.create_hosts(["a4", "a5"], labels=["board:a"], acting_user=None)
    lab3, _ = services.create_shard("lab3", [], acting_user=None)
    for order, expected in (("6", ["lab3", "lab2", "lab1"]), ("-6", ["lab1", "lab2", "lab3"])):
        cl = staff.get(url("shard") + f"?o={order}").context["cl"]
        assert [s.hostname for s in cl.result_list] == expected
        assert [s.hosts_total for s in cl.result_list] == [0, 1, 5] if order == "6" else [5, 1, 0]


def test_host_list_sorted_by_status_breaks_ties_by_id_in_the_same_direction(fleet, staff):
    """One (status, id) index answers either direction: ties go by id the way the column goes."""
    services.lock_hosts(["a3"], "", acting_user=None)
    Host.objects.filter(hostname__in=["a2", "c1"]).update(status="Repairing")
    ids = {h.hostname: h.id for h in Host.objects.all()}
    ready = sorted(["a1", "a3", "b1"], key=ids.get)
    repairing = sorted(["a2", "c1"], key=ids.get)
    ascending = staff.get(url("host") + "?o=2").context["cl"].result_list
    assert [h.hostname for h in ascending] == ready + repairing
    descending = staff.get(url("host") + "?o=-2").context["cl"].result_list
    assert [h.hostname for h in descending] == repairing[::-1] + ready[::-1]
    # A search still finds a part of a name, in any case (a trigram index on PostgreSQL).
    assert [h.hostname for h in staff.get(url("host") + "?q=B1").context["cl"].result_list] == ["b1"]


def test_host_search_index_is_postgresql_only(db):
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'host_hostname_trgm_idx'")
            (definition,) = cursor.fetchone()
            assert "gin" in definition and "gin_trgm_ops" in definition and "upper" in definition
        else:
            cursor.execute("SELECT name FROM sqlite_master WHERE name = 'host_hostname_trgm_idx'")
            assert cursor.fetchone() is None


def test_a_deep_page_lists_the_rows_a_plain_slice_would(staff, monkeypatch):
    """Past DeepPaginator.DEEP_OFFSET the page's rows come by id from a subquery: the same rows, in
    the same order, in the same number of queries, sorted or searched."""
    from master.admin.base import DeepPaginator

    services.create_labels(["wifi", "usb"], acting_user=None)
    services.create_hosts([f"h{i:03}" for i in range(250)], labels=["wifi", "usb"], acting_user=None)
    Host.objects.filter(hostname__endswith="7").update(status="Repairing")
    wifi = Label.objects.get(name="wifi").id
    pages = {}
    for deep in (10_000, 100):
        monkeypatch.setattr(DeepPaginator, "DEEP_OFFSET", deep)
        # A filter on labels (many-to-many) makes the admin's queryset DISTINCT.
        for query in (
            "?p=2",
            "?p=3",
            "?o=2&p=2",
            "?o=-2&p=3",
            "?q=h1&p=2",
            "?o=-1&p=3",
            "?o=5&p=2",
            f"?labels__id__exact={wifi}&p=3",
        ):
            cl = staff.get(url("host") + query).context["cl"]
            pages.setdefault(query, []).append([h.hostname for h in cl.result_list])
    for query, (plain, deep_rows) in pages.items():
        assert plain == deep_rows and plain, query
    assert len(pages["?p=3"][0]) == 50 and pages["?p=2"][0][0] == "h100"
