"""`job create --input`: a directory packs to the same bytes whatever its times and owners, names
are checked, and what a shard would refuse (a link) is refused before anything is uploaded."""

import io
import os
import tarfile

import click
import pytest

from cli.blobs import pack, pack_dir, parse_input
from cli.client import CliError


def make_tree(root):
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "b.txt").write_bytes(b"B")
    (root / "a.sh").write_bytes(b"#!/bin/sh\n")
    (root / "a.sh").chmod(0o755)


def test_a_directory_packs_to_the_same_bytes_whatever_its_times(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    make_tree(one)
    make_tree(two)
    os.utime(two / "sub" / "b.txt", (1, 1))
    os.utime(two / "sub", (2, 2))
    first, second = io.BytesIO(), io.BytesIO()
    pack_dir(one, first)
    pack_dir(two, second)
    assert first.getvalue() == second.getvalue()
    with tarfile.open(fileobj=io.BytesIO(first.getvalue())) as tar:
        members = [(m.name, m.mtime, m.uid, m.mode) for m in tar]
    assert members == [("a.sh", 0, 0, 0o755), ("sub", 0, 0, 0o755), ("sub/b.txt", 0, 0, 0o644)]
    packed = pack(one, "tree")
    try:
        assert packed.kind == "tar" and packed.size == len(first.getvalue())
    finally:
        packed.path.unlink()


def test_a_link_in_a_directory_input_is_refused(tmp_path):
    make_tree(tmp_path / "d")
    (tmp_path / "d" / "link").symlink_to("/etc/passwd")
    with pytest.raises(CliError, match="link is a symbolic link"):
        pack_dir(tmp_path / "d", io.BytesIO())


def test_an_input_name_defaults_to_the_base_name_and_is_checked(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"x")
    assert parse_input(str(tmp_path / "model.bin")) == (tmp_path / "model.bin", "model.bin")
    assert parse_input(f"{tmp_path / 'model.bin'}:weights") == (tmp_path / "model.bin", "weights")
    with pytest.raises(click.BadParameter, match="input name"):
        parse_input(f"{tmp_path / 'model.bin'}:../x")
    with pytest.raises(click.BadParameter, match="no such file"):
        parse_input(str(tmp_path / "missing"))


def test_an_upload_sends_exactly_the_length_hashed_even_if_the_file_changes(tmp_path):
    """A file that grew since it was hashed sent its new bytes past the Content-Length (the master read
    them as the next request); one that shrank left the master waiting. Both send the length announced."""
    from cli.blobs import _Reader

    path = tmp_path / "log.txt"
    path.write_bytes(b"a" * 10)
    with open(path, "rb") as handle:
        reader = _Reader(handle, 4, None)
        assert len(reader) == 4 and b"".join(iter(lambda: reader.read(8192), b"")) == b"aaaa"
    with open(path, "rb") as handle:
        reader = _Reader(handle, 16, None)
        assert b"".join(iter(lambda: reader.read(8192), b"")) == b"a" * 10 + bytes(6)


def test_a_directory_that_cannot_be_read_refuses_the_input_instead_of_packing_it_empty(tmp_path):
    """A path past PATH_MAX inside the directory was a traceback (and os.walk skips, silently, what it
    cannot list: it would have been packed empty)."""
    root = tmp_path / "deep"
    root.mkdir()
    here = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(25):
            os.mkdir("d" * 200, dir_fd=here)
            down = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=here)
            os.close(here)
            here = down
        os.close(os.open("weights.bin", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=here))
    finally:
        os.close(here)
    with pytest.raises(CliError, match=f"--input {root}: .*too long"):
        pack(root, "deep")


def test_a_directory_of_more_entries_than_a_shard_unpacks_is_refused_before_upload(tmp_path, monkeypatch):
    import cli.blobs

    monkeypatch.setattr(cli.blobs, "MAX_TAR_MEMBERS", 2)
    make_tree(tmp_path / "d")
    with pytest.raises(CliError, match="more than 2 files and directories"):
        pack(tmp_path / "d", "d")
