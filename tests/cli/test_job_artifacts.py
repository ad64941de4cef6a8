"""`job artifacts --get PATH [-o FILE]` against a live master: the output lands where asked, a device or
fifo given as -o is written into and never replaced, a directory gets the base name, an existing file
is replaced whole only once the digest checks out, and a path several entries wrote needs --hqe."""

import hashlib
import io
import os
import stat

import pytest
from django.core.files.storage import storages

from master.blobs.models import Artifact
from master.blobs.store import receive_blob
from tests.cli.conftest import fails, ok

pytestmark = pytest.mark.django_db(transaction=True)

DATA = b"a profile\n" * 500
DIGEST = hashlib.sha256(DATA).hexdigest()


@pytest.fixture(autouse=True)
def blob_dir(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "blobs": {**settings.STORAGES["blobs"], "OPTIONS": {"location": str(tmp_path / "blobs")}},
    }
    storages._storages = {}
    storages.backends = settings.STORAGES
    yield
    storages._storages = {}


@pytest.fixture
def job_with_output(fleet):
    receive_blob(DIGEST, io.BytesIO(DATA), len(DATA))
    job = fleet.job()
    hqe = job.hqes.get()
    Artifact.objects.create(hqe=hqe, path="prof/out.txt", size=len(DATA), digest=DIGEST)
    return job, hqe


def test_an_output_goes_to_a_file_a_directory_or_through_a_link(cli, job_with_output, tmp_path, monkeypatch):
    job, _ = job_with_output
    monkeypatch.chdir(tmp_path)
    existing = tmp_path / "existing.txt"
    existing.write_bytes(b"old")
    ok(cli("job", "artifacts", str(job.id), "--get", "prof/out.txt", "-o", str(existing)))
    assert existing.read_bytes() == DATA
    (tmp_path / "dir").mkdir()
    ok(cli("job", "artifacts", str(job.id), "--get", "prof/out.txt", "-o", str(tmp_path / "dir")))
    assert (tmp_path / "dir" / "out.txt").read_bytes() == DATA
    real = tmp_path / "real.txt"
    real.write_bytes(b"")
    (tmp_path / "link.txt").symlink_to(real)
    ok(cli("job", "artifacts", str(job.id), "--get", "prof/out.txt", "-o", str(tmp_path / "link.txt")))
    assert (tmp_path / "link.txt").is_symlink() and real.read_bytes() == DATA
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".part")) == []


def test_a_device_or_fifo_as_the_output_is_written_into_never_replaced(cli, job_with_output, tmp_path):
    """`-o /dev/null` once put a regular file in place of /dev/null (written beside it, then renamed)."""
    job, _ = job_with_output
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    ok(cli("job", "artifacts", str(job.id), "--get", "prof/out.txt", "-o", str(null)))
    assert stat.S_ISCHR(null.lstat().st_mode)
    assert [p.name for p in tmp_path.iterdir() if p.name != "blobs"] == ["null"]


def test_a_path_several_entries_wrote_needs_hqe(cli, fleet, tmp_path):
    receive_blob(DIGEST, io.BytesIO(DATA), len(DATA))
    job = fleet.job(meta_hosts=[("board:a", 2)])
    first, second = job.hqes.order_by("id")
    for hqe in (first, second):
        Artifact.objects.create(hqe=hqe, path="out.txt", size=len(DATA), digest=DIGEST)
    fails(
        cli("job", "artifacts", str(job.id), "--get", "out.txt", "-o", str(tmp_path / "x")),
        f"out.txt: written by entries {first.id}, {second.id}: choose one with --hqe",
    )
    ok(cli("job", "artifacts", str(job.id), "--get", "out.txt", "--hqe", str(second.id), "-o", str(tmp_path / "x")))
    assert (tmp_path / "x").read_bytes() == DATA
