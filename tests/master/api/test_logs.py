"""Live logs on the master: a shard's chunks at byte offsets (POST /api/v1/logs/append) and a reader's
slices from an offset (GET /api/v1/jobs/{id}/log). Every response is checked against docs/openapi.yaml."""

from datetime import timedelta

import pytest
from django.utils import timezone

from common.constants import MAX_LOG_CHUNK_BYTES, HQEStatus
from common.models import HostQueueEntry
from master.logs.models import RunLog, RunLogChunk
from master.logs.store import utf8_prefix
from tests.master.api.conftest import CheckedClient, client_for
from tests.support import assert_status


def push(client: CheckedClient, hqe: int, offset: int, data: bytes, final: bool = False, **extra: str):
    params = f"hqe={hqe}&offset={offset}&final={'true' if final else 'false'}"
    params += "".join(f"&{k}={v}" for k, v in extra.items())
    return client.post(f"/api/v1/logs/append?{params}", data=data, content_type="application/octet-stream")


def stored(hqe: int) -> bytes:
    return b"".join(bytes(c.data) for c in RunLogChunk.objects.filter(log_id=hqe).order_by("start"))


@pytest.fixture
def lab1(fleet) -> CheckedClient:
    return client_for(fleet.token1)


@pytest.fixture
def hqe(fleet) -> HostQueueEntry:
    return HostQueueEntry.objects.get(job=fleet.job())


def test_chunks_at_their_offsets_make_the_log_byte_for_byte(lab1, hqe):
    first = push(lab1, hqe.id, 0, b"line 1\n")
    assert_status(first, 200)
    assert first.json() == {"hqe": hqe.id, "size": 7, "kept": 7, "truncated": False, "complete": False, "new": 7}
    second = push(lab1, hqe.id, 7, b"\x00\xff\xfe bytes \xed\xa0\x80\n", final=True)
    assert second.json()["size"] == 7 + 14 and second.json()["complete"] is True
    assert stored(hqe.id) == b"line 1\n\x00\xff\xfe bytes \xed\xa0\x80\n"


def test_a_duplicate_chunk_is_acknowledged_and_not_appended_twice(lab1, hqe):
    push(lab1, hqe.id, 0, b"abc")
    again = push(lab1, hqe.id, 0, b"abc")
    assert_status(again, 200)
    assert again.json()["size"] == 3 and again.json()["new"] == 0
    # A chunk overlapping the end adds only what is new.
    overlap = push(lab1, hqe.id, 1, b"bcdef")
    assert overlap.json()["size"] == 6 and overlap.json()["new"] == 3
    assert stored(hqe.id) == b"abcdef"
    assert RunLogChunk.objects.filter(log_id=hqe.id).count() == 1  # small appends share a row


def test_a_chunk_past_the_end_is_refused_with_the_offset_to_send_and_changes_nothing(lab1, hqe):
    push(lab1, hqe.id, 0, b"abc")
    gap = push(lab1, hqe.id, 5, b"xyz")
    assert_status(gap, 409)
    assert gap.json()["detail"] == {"field": "offset", "expected_offset": 3}
    assert "send from offset 3" in gap.json()["error"]
    assert stored(hqe.id) == b"abc" and RunLog.objects.get(hqe=hqe).size == 3


def test_a_first_chunk_past_zero_is_a_gap_too(lab1, hqe):
    gap = push(lab1, hqe.id, 10, b"late")
    assert_status(gap, 409)
    assert gap.json()["detail"]["expected_offset"] == 0
    assert not RunLogChunk.objects.exists()


def test_the_master_keeps_the_log_up_to_its_cap_then_only_counts_and_says_it_is_cut(lab1, hqe, settings, user):
    settings.FLEETSHARD_MAX_LOG_BYTES = 10
    assert push(lab1, hqe.id, 0, b"0123456").json()["truncated"] is False
    cut = push(lab1, hqe.id, 7, b"789abcdef").json()
    assert cut == {"hqe": hqe.id, "size": 16, "kept": 10, "truncated": True, "complete": False, "new": 9}
    # Past the cap nothing is stored, so a chunk past the end is no gap: it is counted.
    later = push(lab1, hqe.id, 100, b"more", final=True).json()
    assert later["size"] == 104 and later["kept"] == 10 and later["complete"] is True
    assert stored(hqe.id) == b"0123456789"
    read = user.get(f"/api/v1/jobs/{hqe.job_id}/log").json()
    assert read["text"] == "0123456789" and read["truncated"] is True and read["size"] == 10


def test_a_raised_cap_never_stores_bytes_after_a_hole(lab1, hqe, settings):
    settings.FLEETSHARD_MAX_LOG_BYTES = 4
    push(lab1, hqe.id, 0, b"abcdef")
    settings.FLEETSHARD_MAX_LOG_BYTES = 100
    assert push(lab1, hqe.id, 6, b"ghi").json()["kept"] == 4
    assert stored(hqe.id) == b"abcd"


def test_a_shard_may_not_write_the_log_of_another_shards_hqe(fleet, hqe):
    lab2 = client_for(fleet.token2)
    refused = push(lab2, hqe.id, 0, b"not mine")
    assert_status(refused, 403)
    assert refused.json()["detail"]["field"] == "hqe" and "not of a job on shard lab2" in refused.json()["error"]
    assert not RunLog.objects.exists()


def test_a_persons_token_may_not_push_logs(staff, hqe):
    refused = push(staff, hqe.id, 0, b"hello")
    assert_status(refused, 403)
    assert "only a shard's token" in refused.json()["error"]
    assert not RunLog.objects.exists()


def test_pushing_without_a_token_is_401(anonymous, hqe):
    assert_status(push(anonymous, hqe.id, 0, b"x"), 401)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("offset=0", "hqe"),
        ("hqe=0&offset=0", "hqe"),
        ("hqe=abc&offset=0", "hqe"),
        ("hqe=%C2%B3&offset=0", "hqe"),
        ("hqe={hqe}", "offset"),
        ("hqe={hqe}&offset=-1", "offset"),
        ("hqe={hqe}&offset=1e3", "offset"),
        ("hqe={hqe}&offset=99999999999999999999", "offset"),
        ("hqe={hqe}&offset=0&final=maybe", "final"),
        ("hqe={hqe}&offset=9223372036854775807", "offset"),
    ],
)
def test_bad_parameters_are_refused_naming_the_field_and_change_nothing(lab1, hqe, query, field):
    resp = lab1.post(
        "/api/v1/logs/append?" + query.format(hqe=hqe.id), data=b"xy", content_type="application/octet-stream"
    )
    assert_status(resp, 400)
    assert resp.json()["detail"]["field"] == field
    assert not RunLog.objects.exists()


def test_an_unknown_hqe_is_404(lab1, fleet):
    resp = push(lab1, 999999, 0, b"x")
    assert_status(resp, 404)
    assert resp.json()["detail"]["field"] == "hqe"


def test_a_chunk_over_the_bound_is_413_and_changes_nothing(lab1, hqe):
    resp = push(lab1, hqe.id, 0, b"x" * (MAX_LOG_CHUNK_BYTES + 1))
    assert_status(resp, 413)
    assert resp.json()["detail"]["field"] == "body"
    assert not RunLog.objects.exists()
    assert push(lab1, hqe.id, 0, b"x" * MAX_LOG_CHUNK_BYTES).json()["size"] == MAX_LOG_CHUNK_BYTES


def test_an_append_costs_a_fixed_number_of_queries(lab1, hqe, django_assert_num_queries):
    push(lab1, hqe.id, 0, b"first")
    # Token (and its shard), the HQE's owner; then in one transaction: hold the HQE against a purge, lock the
    # log, find its last row (small appends share it), store the chunk, move its end.
    with django_assert_num_queries(9):
        assert_status(push(lab1, hqe.id, 5, b"second"), 200)


def test_a_log_that_ended_takes_no_more_bytes_but_acknowledges_a_repeated_final(lab1, hqe, user):
    push(lab1, hqe.id, 0, b"done\n", final=True)
    assert push(lab1, hqe.id, 0, b"done\n", final=True).json() == {
        "hqe": hqe.id,
        "size": 5,
        "kept": 5,
        "truncated": False,
        "complete": True,
        "new": 0,
    }
    late = push(lab1, hqe.id, 5, b"forged after the end\n")
    assert_status(late, 400)
    assert late.json()["detail"]["field"] == "offset"
    assert "ended at byte 5" in late.json()["error"]
    assert stored(hqe.id) == b"done\n" and RunLog.objects.get(hqe=hqe).size == 5
    # A reader that stopped at `ended` missed nothing.
    assert user.get(f"/api/v1/jobs/{hqe.job_id}/log").json()["text"] == "done\n"


def test_a_cut_log_that_ended_takes_no_more_bytes_either(lab1, hqe, settings):
    settings.FLEETSHARD_MAX_LOG_BYTES = 3
    push(lab1, hqe.id, 0, b"abcdef", final=True)
    late = push(lab1, hqe.id, 100, b"more")
    assert_status(late, 400)
    assert late.json()["detail"]["field"] == "offset"
    assert RunLog.objects.get(hqe=hqe).size == 6


# Reading


def test_a_follower_reads_from_its_offset_only_what_is_new(lab1, hqe, user):
    push(lab1, hqe.id, 0, b"one\ntwo\n")
    url = f"/api/v1/jobs/{hqe.job_id}/log"
    first = user.get(url).json()
    assert first["text"] == "one\ntwo\n" and first["next_offset"] == 8 and first["ended"] is False
    assert user.get(url, {"offset": 8}).json()["text"] == ""
    push(lab1, hqe.id, 8, b"three\n")
    then = user.get(url, {"offset": 8, "hqe": hqe.id}).json()
    assert then["text"] == "three\n" and then["offset"] == 8 and then["next_offset"] == 14
    assert user.get(url, {"offset": 4, "limit": 4}).json()["text"] == "two\n"


def test_a_slice_never_ends_in_half_a_character_until_the_log_ends(lab1, hqe, user):
    euro = "€".encode()  # three bytes
    push(lab1, hqe.id, 0, b"price " + euro[:2])
    url = f"/api/v1/jobs/{hqe.job_id}/log"
    first = user.get(url).json()
    assert first["text"] == "price " and first["next_offset"] == 6
    push(lab1, hqe.id, 8, euro[2:] + b"5 \xff\x00", final=True)
    rest = user.get(url, {"offset": 6}).json()
    assert rest["text"] == "€5 \ufffd\ufffd" and rest["complete"] is True and rest["ended"] is True


@pytest.mark.parametrize("inside", [2, 3, 4])
def test_a_reader_starting_inside_a_character_gets_the_next_whole_one(lab1, hqe, user, inside):
    data = "a😀b".encode()  # the emoji is bytes 1-4
    push(lab1, hqe.id, 0, data)
    piece = user.get(f"/api/v1/jobs/{hqe.job_id}/log", {"offset": inside}).json()
    assert piece["text"] == "b" and piece["offset"] == 5 and piece["next_offset"] == 6


def test_a_stray_continuation_byte_at_the_start_is_still_shown(lab1, hqe, user):
    push(lab1, hqe.id, 0, b"a\x80\x80b")
    url = f"/api/v1/jobs/{hqe.job_id}/log"
    assert user.get(url, {"offset": 1}).json()["text"] == "\ufffd\ufffdb"
    assert user.get(url, {"offset": 2}).json()["text"] == "\ufffdb"


def test_a_reader_inside_a_character_whose_end_has_not_come_waits_for_the_next_one(lab1, hqe, user):
    push(lab1, hqe.id, 0, b"a" + "😀".encode()[:2])
    url = f"/api/v1/jobs/{hqe.job_id}/log"
    piece = user.get(url, {"offset": 2}).json()
    assert piece["text"] == "" and piece["next_offset"] == 3
    push(lab1, hqe.id, 3, "😀".encode()[2:] + b"b")
    assert user.get(url, {"offset": piece["next_offset"]}).json()["text"] == "b"


def test_a_follower_reading_four_bytes_at_a_time_gets_every_character(lab1, hqe, user):
    text = "a€😀\u00e9b"
    push(lab1, hqe.id, 0, text.encode())
    url, offset, seen = f"/api/v1/jobs/{hqe.job_id}/log", 0, ""
    for _ in range(20):
        piece = user.get(url, {"offset": offset, "limit": 4}).json()
        seen, offset = seen + piece["text"], piece["next_offset"]
    assert seen == text


def test_a_log_ending_in_a_cut_character_shows_it_as_a_replacement_once_complete(lab1, hqe, user):
    push(lab1, hqe.id, 0, b"cut \xe2\x82", final=True)
    assert user.get(f"/api/v1/jobs/{hqe.job_id}/log").json()["text"] == "cut \ufffd"


def test_an_hqe_without_a_log_is_empty_and_ended_once_it_never_ran(user, hqe):
    url = f"/api/v1/jobs/{hqe.job_id}/log"
    assert user.get(url).json() == {
        "job": hqe.job_id,
        "hqe": hqe.id,
        "hqe_status": "Queued",
        "offset": 0,
        "next_offset": 0,
        "size": 0,
        "text": "",
        "truncated": False,
        "complete": False,
        "ended": False,
    }
    HostQueueEntry.objects.filter(id=hqe.id).update(status=HQEStatus.ABORTED, finished_on=timezone.now())
    assert user.get(url).json()["ended"] is True


def test_an_ended_hqe_whose_shard_never_says_its_log_ended_ends_after_a_minute(lab1, user, hqe):
    push(lab1, hqe.id, 0, b"partial")
    now = timezone.now()
    HostQueueEntry.objects.filter(id=hqe.id).update(
        status=HQEStatus.COMPLETED, started_on=now - timedelta(minutes=5), finished_on=now - timedelta(seconds=5)
    )
    url = f"/api/v1/jobs/{hqe.job_id}/log"
    assert user.get(url).json()["ended"] is False
    HostQueueEntry.objects.filter(id=hqe.id).update(finished_on=now - timedelta(minutes=2))
    assert user.get(url).json()["ended"] is True


def test_a_job_of_several_entries_needs_hqe(user, fleet):
    job = fleet.job(meta_hosts=[("board:a", 2)])
    resp = user.get(f"/api/v1/jobs/{job.id}/log")
    assert_status(resp, 400)
    assert resp.json()["detail"]["field"] == "hqe"
    assert "has 2 entries" in resp.json()["error"]
    other = HostQueueEntry.objects.filter(job=job).last()
    assert user.get(f"/api/v1/jobs/{job.id}/log", {"hqe": other.id}).json()["hqe"] == other.id


@pytest.mark.parametrize(
    ("path", "params", "status", "field"),
    [
        ("/api/v1/jobs/999999/log", {}, 404, "id"),
        ("/api/v1/jobs/abc/log", {}, 404, "id"),
        ("/api/v1/jobs/{job}/log", {"hqe": "999999"}, 404, "hqe"),
        ("/api/v1/jobs/{job}/log", {"hqe": "x"}, 400, "hqe"),
        ("/api/v1/jobs/{job}/log", {"offset": "-5"}, 400, "offset"),
        ("/api/v1/jobs/{job}/log", {"limit": "0"}, 200, None),
        ("/api/v1/jobs/{job}/log", {"limit": "3"}, 400, "limit"),
        ("/api/v1/jobs/{job}/log", {"limit": "4"}, 200, None),
        ("/api/v1/jobs/{job}/log", {"limit": str(2**40)}, 400, "limit"),
    ],
)
def test_bad_reads_name_what_is_wrong(user, hqe, path, params, status, field):
    resp = user.get(path.format(job=hqe.job_id), params)
    assert_status(resp, status)
    if field:
        assert resp.json()["detail"]["field"] == field


def test_another_jobs_entry_is_not_found(user, fleet, hqe):
    other = fleet.job("other")
    resp = user.get(f"/api/v1/jobs/{other.id}/log", {"hqe": hqe.id})
    assert_status(resp, 404)
    assert resp.json()["detail"]["field"] == "hqe"


def test_reading_needs_a_person_not_a_shard(anonymous, lab1, hqe):
    assert_status(anonymous.get(f"/api/v1/jobs/{hqe.job_id}/log"), 401)
    assert_status(lab1.get(f"/api/v1/jobs/{hqe.job_id}/log"), 401)


def test_a_read_costs_a_fixed_number_of_queries_however_many_chunks(lab1, user, hqe, django_assert_num_queries):
    offset = 0
    for n in range(50):
        line = f"line {n}\n".encode()
        push(lab1, hqe.id, offset, line)
        offset += len(line)
    # The token with its user; the job's entry; the log; its chunks.
    with django_assert_num_queries(5):
        assert user.get(f"/api/v1/jobs/{hqe.job_id}/log").json()["text"].count("\n") == 50


@pytest.mark.parametrize(
    ("data", "length"),
    [
        (b"", 0),
        (b"abc", 3),
        (b"ab\xe2", 2),
        (b"ab\xe2\x82", 2),
        (b"ab\xe2\x82\xac", 5),
        (b"\xf0\x9f\x98", 0),
        (b"\xf0\x9f\x98\x80", 4),
        (b"a\x80\x80\x80\x80", 5),
        (b"a\xff", 2),
    ],
)
def test_utf8_prefix_drops_only_a_sequence_cut_at_the_end(data, length):
    assert utf8_prefix(data) == length
