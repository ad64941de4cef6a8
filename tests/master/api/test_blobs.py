"""Blobs on the master (PUT/HEAD/GET /api/v1/blobs/DIGEST): stored only once digest and size check
out, nothing kept otherwise, read back in ranges; jobs that name them; shards that read only their
own jobs' blobs; outputs reported and listed. Every JSON response is checked against docs/openapi.yaml."""

import hashlib
import os
import resource
import signal
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.files.storage import storages
from django.utils import timezone

from common.blobs import blob_name
from common.models import Job
from master.blobs.models import Artifact, Blob
from master.blobs.store import purge_blobs
from master.sync.heartbeat import job_records
from tests.master.api.conftest import CheckedClient, client_for
from tests.support import assert_status

DATA = b"a model, or a program\n" * 1000
DIGEST = hashlib.sha256(DATA).hexdigest()
EMPTY = hashlib.sha256(b"").hexdigest()


def put(client: CheckedClient, digest: str, data: bytes, **extra: str):
    return client.put(f"/api/v1/blobs/{digest}", data=data, content_type="application/octet-stream", **extra)


def stored_files() -> list[str]:
    """Every file under the blob storage, the staging directory of unfinished uploads included."""
    root = Path(storages["blobs"].location)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture(autouse=True)
def blob_dir(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "blobs": {**settings.STORAGES["blobs"], "OPTIONS": {"location": str(tmp_path / "blobs")}},
    }
    storages._storages = {}
    storages.backends = settings.STORAGES
    yield tmp_path / "blobs"
    storages._storages = {}


def test_a_blob_is_stored_once_read_back_whole_and_in_ranges(user):
    assert_status(user.head(f"/api/v1/blobs/{DIGEST}"), 404)
    first = put(user, DIGEST, DATA)
    assert_status(first, 201)
    assert first.json() == {"digest": DIGEST, "size": len(DATA), "created": True}
    assert put(user, DIGEST, DATA).json()["created"] is False
    head = user.head(f"/api/v1/blobs/{DIGEST}")
    assert head.status_code == 200 and head["Content-Length"] == str(len(DATA))
    got = user.get(f"/api/v1/blobs/{DIGEST}")
    assert got.status_code == 200 and b"".join(got.streaming_content) == DATA
    part = user.get(f"/api/v1/blobs/{DIGEST}", HTTP_RANGE="bytes=100-")
    assert part.status_code == 206 and part["Content-Range"] == f"bytes 100-{len(DATA) - 1}/{len(DATA)}"
    assert b"".join(part.streaming_content) == DATA[100:]
    past = user.get(f"/api/v1/blobs/{DIGEST}", HTTP_RANGE=f"bytes={len(DATA)}-")
    assert_status(past, 416)
    assert stored_files() == [blob_name(DIGEST)]
    assert Blob.objects.get().size == len(DATA)


def test_a_body_that_is_not_its_digest_is_refused_and_nothing_is_kept(user):
    wrong = put(user, hashlib.sha256(b"other").hexdigest(), DATA)
    assert wrong.status_code == 400 and "digest mismatch" in wrong.json()["error"]
    assert not Blob.objects.exists() and stored_files() == []


def test_a_size_that_lies_is_refused_and_nothing_is_kept(user):
    longer = put(user, DIGEST, DATA, CONTENT_LENGTH=str(len(DATA) + 10))
    assert longer.status_code == 400 and f"of the {len(DATA) + 10} bytes announced" in longer.json()["error"]
    shorter = put(user, DIGEST, DATA, CONTENT_LENGTH=str(len(DATA) - 10))
    assert shorter.status_code == 400 and "digest mismatch" in shorter.json()["error"]
    assert not Blob.objects.exists() and stored_files() == []


def test_an_empty_file_is_a_blob_like_any_other_but_only_under_its_own_digest(user):
    assert_status(put(user, DIGEST, b"", CONTENT_LENGTH="0"), 400)
    assert_status(put(user, EMPTY, b"", CONTENT_LENGTH="0"), 201)
    assert b"".join(user.get(f"/api/v1/blobs/{EMPTY}").streaming_content) == b""


def test_a_body_over_the_limit_is_refused_from_its_declared_length_without_reading_it(user, settings):
    three_gib = str(3 * 1024**3)
    refused = put(user, DIGEST, DATA, CONTENT_LENGTH=three_gib)
    assert refused.status_code == 413 and "FLEETSHARD_MAX_INPUT_BYTES" in refused.json()["error"]
    settings.FLEETSHARD_MAX_INPUT_BYTES = len(DATA) - 1
    assert_status(put(user, DIGEST, DATA), 413)
    assert not Blob.objects.exists() and stored_files() == []


@pytest.mark.parametrize("name", ["abc", DIGEST.upper(), DIGEST + "0", "../" + DIGEST[3:], "g" * 64])
def test_a_blob_name_that_is_not_a_digest_is_refused(user, name):
    for response in (put(user, name, DATA), user.get(f"/api/v1/blobs/{name}")):
        assert response.status_code in (400, 404), response.content
        if response.status_code == 400:
            assert "not a SHA-256 digest" in response.json()["error"]
    assert not Blob.objects.exists() and stored_files() == []


def test_a_put_without_a_length_is_refused(user):
    response = put(user, DIGEST, DATA, CONTENT_LENGTH="")
    assert_status(response, 411)
    assert not Blob.objects.exists()


def test_anonymous_callers_are_refused(db, anonymous):
    assert_status(put(anonymous, DIGEST, DATA), 401)
    assert not Blob.objects.exists()


def test_a_job_names_blobs_the_master_has_and_carries_them_to_its_shard(fleet, user):
    put(user, DIGEST, DATA)
    body = {"name": "bench", "command": "true", "meta_hosts": ["board:a"]}
    model = {"name": "model", "digest": DIGEST, "size": len(DATA), "kind": "tar"}
    missing = user.post("/api/v1/jobs/", {**body, "inputs": [{**model, "digest": EMPTY}]}, format="json")
    assert missing.status_code == 400 and "upload it first" in missing.json()["error"]
    lying = user.post("/api/v1/jobs/", {**body, "inputs": [{**model, "size": 5}]}, format="json")
    assert_status(lying, 400)
    bad_name = user.post("/api/v1/jobs/", {**body, "inputs": [{**model, "name": "../x"}]}, format="json")
    assert bad_name.status_code == 400 and "input name" in bad_name.json()["error"]
    twice = user.post("/api/v1/jobs/", {**body, "inputs": [model, model]}, format="json")
    assert twice.status_code == 400 and "twice" in twice.json()["error"]
    created = user.post("/api/v1/jobs/", {**body, "inputs": [model]}, format="json")
    assert_status(created, 201)
    assert created.json()["inputs"] == [model]
    assert user.get(f"/api/v1/jobs/{created.json()['id']}/").json()["inputs"] == [model]
    assert job_records([created.json()["id"]])[0][0].to_wire()["inputs"] == [model]


def test_a_job_without_inputs_sends_none_on_the_wire(fleet):
    assert "inputs" not in job_records([fleet.job().id])[0][0].to_wire()


def test_a_shard_reads_its_own_jobs_blobs_only(fleet, user):
    put(user, DIGEST, DATA)
    put(user, EMPTY, b"", CONTENT_LENGTH="0")
    fleet.job(inputs=[{"name": "m", "digest": DIGEST, "size": len(DATA), "kind": "file"}])
    lab1, lab2 = client_for(fleet.token1), client_for(fleet.token2)
    assert b"".join(lab1.get(f"/api/v1/blobs/{DIGEST}").streaming_content) == DATA
    refused = lab2.get(f"/api/v1/blobs/{DIGEST}")
    assert refused.status_code == 403 and "lab2" in refused.json()["error"]
    # A blob no job of lab1 names, even one the master has.
    assert_status(lab1.get(f"/api/v1/blobs/{EMPTY}"), 403)


def test_a_shard_reports_a_runs_outputs_and_people_list_them(fleet, user):
    job = fleet.job()
    hqe = job.hqes.get()
    lab1, lab2 = client_for(fleet.token1), client_for(fleet.token2)
    report = {
        "files": [{"path": "profile/out.json", "size": len(DATA), "digest": DIGEST}],
        "skipped": [{"path": "link", "size": 0, "reason": "a symbolic link: not followed"}],
    }
    url = f"/api/v1/artifacts?hqe={hqe.id}"
    before = lab1.post(url, report, format="json")
    assert before.status_code == 400 and "upload it first" in before.json()["error"]
    put(lab1, DIGEST, DATA)
    assert_status(lab2.post(url, report, format="json"), 403)
    assert_status(user.post(url, report, format="json"), 403)
    for path in ("../etc/passwd", "/abs", "a//b", "a/./b"):
        bad = {"files": [{"path": path, "size": len(DATA), "digest": DIGEST}]}
        assert_status(lab1.post(url, bad, format="json"), 400)
    assert not Artifact.objects.exists()
    assert lab1.post(url, report, format="json").json() == {"hqe": hqe.id, "recorded": 2}
    assert lab1.post(url, report, format="json").json()["recorded"] == 2  # again: the same rows
    listed = user.get(f"/api/v1/jobs/{job.id}/artifacts").json()
    assert listed == [
        {"hqe": hqe.id, "path": "link", "size": 0, "digest": "", "skipped": "a symbolic link: not followed"},
        {"hqe": hqe.id, "path": "profile/out.json", "size": len(DATA), "digest": DIGEST, "skipped": ""},
    ]
    # The shard that ran it may read its outputs back; the other may not.
    assert_status(lab1.get(f"/api/v1/blobs/{DIGEST}"), 200)
    assert_status(lab2.get(f"/api/v1/blobs/{DIGEST}"), 403)
    assert user.get(f"/api/v1/jobs/{job.id}/artifacts?hqe=999999").json() == []
    assert_status(user.get("/api/v1/jobs/999999/artifacts"), 404)


def test_purge_removes_old_blobs_nothing_refers_to(fleet, user):
    other = b"unreferenced"
    other_digest = hashlib.sha256(other).hexdigest()
    put(user, DIGEST, DATA)
    put(user, other_digest, other)
    fleet.job(inputs=[{"name": "m", "digest": DIGEST, "size": len(DATA), "kind": "file"}])
    Blob.objects.update(last_used=timezone.now() - timedelta(days=31))
    assert purge_blobs(30, dry_run=True) == 1
    assert purge_blobs(30) == 1
    assert list(Blob.objects.values_list("digest", flat=True)) == [DIGEST]
    assert stored_files() == [blob_name(DIGEST)]


def test_purge_keeps_what_was_used_recently(user):
    put(user, DIGEST, DATA)
    assert purge_blobs(30) == 0
    assert Blob.objects.filter(digest=DIGEST).exists()


def test_an_upload_cut_short_leaves_no_staging_file(user, blob_dir):
    put(user, DIGEST, DATA[:10], CONTENT_LENGTH=str(len(DATA)))
    assert stored_files() == [] and not any(os.scandir(blob_dir / ".incoming"))


def test_the_admin_job_page_links_inputs_and_outputs_and_the_links_download(fleet, user, admin_client):
    put(user, DIGEST, DATA)
    job = fleet.job(inputs=[{"name": "m", "digest": DIGEST, "size": len(DATA), "kind": "file"}])
    hqe = job.hqes.get()
    report = {"files": [{"path": "p/out.json", "size": len(DATA), "digest": DIGEST}], "skipped": []}
    client_for(fleet.token1).post(f"/api/v1/artifacts?hqe={hqe.id}", report, format="json")
    page = admin_client.get(f"/admin/common/job/{job.id}/change/").content.decode()
    link = f"/api/v1/blobs/{DIGEST}?name=out.json"
    assert f'href="{link}"' in page and "p/out.json" in page
    assert f'href="/api/v1/blobs/{DIGEST}?name=m"' in page
    download = admin_client.get(link)
    assert download["Content-Disposition"] == 'attachment; filename="out.json"'
    assert b"".join(download.streaming_content) == DATA


def test_any_storage_backend_takes_blobs_through_the_storages_api(user, settings):
    settings.STORAGES = {**settings.STORAGES, "blobs": {"BACKEND": "django.core.files.storage.InMemoryStorage"}}
    storages._storages = {}
    storages.backends = settings.STORAGES
    assert_status(put(user, DIGEST, DATA), 201)
    assert storages["blobs"].exists(blob_name(DIGEST))
    assert b"".join(user.get(f"/api/v1/blobs/{DIGEST}", HTTP_RANGE="bytes=5-9").streaming_content) == DATA[5:10]
    assert_status(put(user, EMPTY, DATA), 400)
    assert not storages["blobs"].exists(blob_name(EMPTY))


def test_a_blob_whose_bytes_went_missing_is_a_clear_404_and_an_upload_stores_it_again(user, blob_dir):
    """A storage restored without its files (or a purge racing an upload): HEAD said 200 so the CLI
    never sent it again, PUT answered "had it", and GET sent its headers and then broke off."""
    put(user, DIGEST, DATA)
    (blob_dir / blob_name(DIGEST)).unlink()
    assert_status(user.head(f"/api/v1/blobs/{DIGEST}"), 404)
    missing = user.get(f"/api/v1/blobs/{DIGEST}")
    assert missing.status_code == 404 and "bytes are missing" in missing.json()["error"]
    again = put(user, DIGEST, DATA)
    assert again.status_code == 201 and again.json()["created"] is True
    assert b"".join(user.get(f"/api/v1/blobs/{DIGEST}").streaming_content) == DATA
    assert Blob.objects.count() == 1 and stored_files() == [blob_name(DIGEST)]


def test_an_ab_job_may_not_name_an_input_variant(fleet, user):
    """Each variant's runs see their own build as $FLEETSHARD_INPUT_DIR/variant: an input of that name
    collided with it on the shard (a file-exists error, and the host sent to repair for it)."""
    put(user, DIGEST, DATA)
    body = {"name": "ab", "command": "true", "meta_hosts": ["board:a"], "variants": ["base", "new"]}
    model = {"name": "variant", "digest": DIGEST, "size": len(DATA), "kind": "file"}
    refused = user.post("/api/v1/jobs/", {**body, "inputs": [model]}, format="json")
    assert refused.status_code == 400 and "input name variant" in refused.json()["error"]
    assert not Job.objects.filter(name="ab").exists()
    plain = user.post("/api/v1/jobs/", {**body, "variants": [], "inputs": [model]}, format="json")
    assert_status(plain, 201)
    renamed = user.post("/api/v1/jobs/", {**body, "inputs": [{**model, "name": "variant+new"}]}, format="json")
    assert_status(renamed, 201)


def test_a_master_whose_disk_is_full_answers_507_and_keeps_nothing(user, blob_dir):
    """A write error of the master's own disk (here a file size limit: EFBIG, as ENOSPC would be) was a 500."""
    big = os.urandom(3 << 20)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    try:
        full = put(user, hashlib.sha256(big).hexdigest(), big)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert full.status_code == 507 and "cannot store the blob now" in full.json()["error"]
    assert not Blob.objects.exists() and stored_files() == []
    assert_status(put(user, hashlib.sha256(big).hexdigest(), big), 201)


def test_a_report_replaces_the_entrys_earlier_one_so_rows_stay_bounded(fleet):
    """Rows were replaced only path by path: a shard reporting again with new paths each time grew an
    entry's outputs without bound."""
    hqe = fleet.job().hqes.get()
    lab1 = client_for(fleet.token1)
    url = f"/api/v1/artifacts?hqe={hqe.id}"
    for batch in range(3):
        skipped = [{"path": f"b{batch}/f{n}", "size": 0, "reason": "a fifo"} for n in range(1000)]
        assert lab1.post(url, {"files": [], "skipped": skipped}, format="json").json()["recorded"] == 1000
    assert Artifact.objects.filter(hqe=hqe).count() == 1000
    assert set(Artifact.objects.values_list("path", flat=True)) == {f"b2/f{n}" for n in range(1000)}
