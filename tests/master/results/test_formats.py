"""Result files of both formats, as real tools write them, and every way a hostile one is refused."""

import json
from datetime import UTC, datetime

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from common.constants import MAX_RESULT_FILE_BYTES
from common.result_formats import MAX_ENTRIES, ParsedEntry, ResultFormatError, parse_result_file

# As tensorflow/tools/test/run_and_gather_logs writes it (proto-JSON: int64 as strings).
TF_SAMPLE = {
    "target": "//tensorflow/core/kernels:adjust_contrast_op_benchmark_test",
    "name": "adjust_contrast_benchmark",
    "entries": {
        "entry": [
            {
                "name": "BM_AdjustContrast_gpu_1_299x299",
                "iters": "100",
                "cpuTime": 0.00021,
                "wallTime": 0.00025,
                "throughput": 1432.5,
                "extras": {
                    "allocator": {"stringValue": "GPU_0_bfc"},
                    "peak_bytes": {"doubleValue": 1048576},
                },
            },
            {"name": "BM_AdjustContrast_cpu_1_299x299", "iters": 50, "wallTime": "0.0125"},
        ]
    },
    "buildConfiguration": {"mode": "opt", "ccFlags": ["-mavx"]},
    "commitId": {"hash": "0123456789abcdef", "snapshot": ""},
    "startTime": "1700000000",
    "runTime": 12.5,
    "machineConfiguration": {"hostname": "dut1", "cpuInfo": {"numCores": 8}},
    "runConfiguration": {"argument": ["--benchmarks=all"]},
    "benchmarkType": "CPP_MICROBENCHMARK",
}

# As a Google Benchmark binary writes with --benchmark_format=json --benchmark_repetitions=3.
GB_SAMPLE = {
    "context": {
        "date": "2024-01-02T03:04:05+01:00",
        "host_name": "dut1",
        "executable": "/build/bench/string_bench",
        "num_cpus": 8,
        "mhz_per_cpu": 2400,
        "cpu_scaling_enabled": False,
        "caches": [{"type": "Data", "level": 1, "size": 32768, "num_sharing": 1}],
        "load_avg": [0.5, 0.4, 0.3],
        "library_build_type": "release",
    },
    "benchmarks": [
        {
            "name": "BM_Copy/64",
            "family_index": 0,
            "per_family_instance_index": 0,
            "run_name": "BM_Copy/64",
            "run_type": "iteration",
            "repetitions": 1,
            "repetition_index": 0,
            "threads": 1,
            "iterations": 1000000,
            "real_time": 12.5,
            "cpu_time": 12.0,
            "time_unit": "ns",
            "bytes_per_second": 5.12e9,
            "items_per_second": 8.0e7,
            "label": "fast path",
        },
        *(
            {
                "name": "BM_Sort",
                "run_name": "BM_Sort",
                "run_type": "iteration",
                "repetitions": 3,
                "repetition_index": i,
                "iterations": 100,
                "real_time": t,
                "cpu_time": t,
                "time_unit": "ms",
                "swaps": float(10 + i),
            }
            for i, t in enumerate((2.0, 9.0, 3.0))
        ),
        *(
            {
                "name": f"BM_Sort_{agg}",
                "run_name": "BM_Sort",
                "run_type": "aggregate",
                "aggregate_name": agg,
                "aggregate_unit": "time",
                "iterations": 3,
                "real_time": 4.6,
                "cpu_time": 4.6,
                "time_unit": "ms",
            }
            for agg in ("mean", "median", "stddev")
        ),
        {
            "name": "BM_Only_median",
            "run_name": "BM_Only",
            "run_type": "aggregate",
            "aggregate_name": "median",
            "iterations": 5,
            "real_time": 7.0,
            "cpu_time": 6.0,
            "time_unit": "us",
        },
        {"name": "BM_Broken", "run_type": "iteration", "error_occurred": True, "error_message": "no device"},
    ],
}


def raw(doc: object) -> bytes:
    return json.dumps(doc).encode()


def error_of(doc: object, name: str = "results.json") -> str:
    with pytest.raises(ResultFormatError) as info:
        parse_result_file(name, doc if isinstance(doc, bytes) else raw(doc))
    return str(info.value)


def test_tensorflow_test_results_with_proto_json_strings():
    run = parse_result_file("tf.json", raw(TF_SAMPLE))
    assert run.format == "tensorflow"
    assert run.test == "adjust_contrast_benchmark"
    assert run.start == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    gpu, cpu = run.entries
    assert gpu == ParsedEntry(
        name="BM_AdjustContrast_gpu_1_299x299",
        wall_time_s=0.00025,
        cpu_time_s=0.00021,
        iterations=100,
        throughput=1432.5,
        extras={"allocator": "GPU_0_bfc", "peak_bytes": 1048576.0},
    )
    assert (cpu.wall_time_s, cpu.iterations, cpu.cpu_time_s, cpu.throughput) == (0.0125, 50, None, None)
    assert run.info["commitId"] == {"hash": "0123456789abcdef", "snapshot": ""}
    assert set(run.info) == set(TF_SAMPLE) - {"name", "startTime", "entries"}


def test_tensorflow_without_name_takes_the_target_and_missing_wall_time_is_not_zero():
    doc = {**TF_SAMPLE, "entries": {"entry": [{"name": "e", "extras": {"zero": {}}}]}}
    del doc["name"]
    run = parse_result_file("tf.json", raw(doc))
    assert run.test == TF_SAMPLE["target"]
    assert run.entries[0].wall_time_s is None
    assert run.entries[0].extras == {"zero": 0.0}


def test_google_benchmark_units_repetitions_aggregates_and_errors():
    run = parse_result_file("gb.json", raw(GB_SAMPLE))
    assert run.format == "google_benchmark"
    assert run.test == "string_bench"
    assert run.start == datetime(2024, 1, 2, 2, 4, 5, tzinfo=UTC)
    by_name = {e.name: e for e in run.entries}
    assert list(by_name) == ["BM_Copy/64", "BM_Sort", "BM_Only"]
    copy = by_name["BM_Copy/64"]
    assert copy.wall_time_s == pytest.approx(12.5e-9)
    assert copy.cpu_time_s == pytest.approx(12.0e-9)
    assert copy.iterations == 1000000
    assert copy.throughput == pytest.approx(5120.0)
    assert copy.extras == {"bytes_per_second": 5.12e9, "items_per_second": 8.0e7, "label": "fast path"}
    sort = by_name["BM_Sort"]  # the median of 2, 9 and 3 ms; the aggregate rows are not entries
    assert sort.wall_time_s == pytest.approx(3.0e-3)
    assert sort.iterations == 300
    assert sort.extras == {"swaps": 11.0, "repetitions": 3.0}
    only = by_name["BM_Only"]  # aggregates only: its median stands for it
    assert (only.wall_time_s, only.cpu_time_s) == (pytest.approx(7e-6), pytest.approx(6e-6))
    assert run.info["errors"] == {"BM_Broken": "no device"}
    assert run.info["host_name"] == "dut1"
    assert "date_assumed_utc" not in run.info


@pytest.mark.parametrize(("unit", "seconds"), [("ns", 2e-9), ("us", 2e-6), ("ms", 2e-3), ("s", 2.0)])
def test_google_benchmark_time_units(unit, seconds):
    doc = {**GB_SAMPLE, "benchmarks": [{"name": "b", "real_time": 2, "cpu_time": 2, "time_unit": unit}]}
    (entry,) = parse_result_file("gb.json", raw(doc)).entries
    assert entry.wall_time_s == pytest.approx(seconds)
    assert entry.cpu_time_s == pytest.approx(seconds)


@pytest.mark.parametrize("date", ["2024/01/02-03:04:05", "2024-01-02 03:04:05"])
def test_google_benchmark_old_local_date_is_taken_as_utc_and_says_so(date):
    doc = {**GB_SAMPLE, "context": {**GB_SAMPLE["context"], "date": date, "executable": "C:\\b\\x.exe"}}
    run = parse_result_file("gb.json", raw(doc))
    assert run.start == datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert run.info["date_assumed_utc"] is True
    assert run.test == "x.exe"


def bench(**row: object) -> dict:
    return {**GB_SAMPLE, "benchmarks": [{"name": "ok", "real_time": 1, "cpu_time": 1}, row]}


def entry(**fields: object) -> dict:
    return {**TF_SAMPLE, "entries": {"entry": [{"name": "ok", "wallTime": 1}, fields]}}


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (bench(name="b", real_time="fast"), "results.json: benchmarks[1].real_time: not a number: 'fast'"),
        (bench(name="b", real_time=-1), "results.json: benchmarks[1].real_time: must not be negative, got -1"),
        (bench(name="b", real_time=True), "results.json: benchmarks[1].real_time: not a number: True"),
        (bench(name="b"), "results.json: benchmarks[1].real_time: required"),
        (bench(name="b", real_time=1, cpu_time=[]), "results.json: benchmarks[1].cpu_time: not a number: []"),
        (bench(name="b", real_time=1, time_unit="h"), "results.json: benchmarks[1].time_unit: expected one of"),
        (bench(name="b", real_time=1, iterations=1.5), "results.json: benchmarks[1].iterations: expected a whole"),
        (bench(name="b", real_time=1, iterations=-3), "results.json: benchmarks[1].iterations: expected a whole"),
        (bench(name="b", real_time=1, run_type="x"), "results.json: benchmarks[1].run_type: expected iteration"),
        (bench(real_time=1), "results.json: benchmarks[1].name: expected a string, got null"),
        (bench(name="", real_time=1), "results.json: benchmarks[1].name: must not be empty"),
        (bench(name="x" * 256, real_time=1), "results.json: benchmarks[1].name: at most 255 characters, got 256"),
        (bench(name="a\x00b", real_time=1), "results.json: benchmarks[1].name: contains NUL or a lone surrogate"),
        (bench(name="a\ud800", real_time=1), "results.json: benchmarks[1].name: contains NUL or a lone surrogate"),
        (
            b'{"benchmarks": [{"name": "b", "real_time": 1e999}],'
            b' "context": {"executable": "b", "date": "2024-01-02 03:04:05"}}',
            "results.json: benchmarks[0].real_time: not a finite number: inf",
        ),
        (bench(name="b", real_time=1, speed="x" * 2000), None),  # a non-numeric unknown key is ignored
        (bench(name="b", real_time=1, label="x" * 2000), "results.json: benchmarks[1].label: at most 1024"),
        ({**GB_SAMPLE, "benchmarks": {}}, "results.json: benchmarks: expected a list, got an object"),
        ({**GB_SAMPLE, "context": []}, "results.json: context: expected an object, got a list"),
        ({**GB_SAMPLE, "context": {"date": "2024-01-02T03:04:05Z"}}, "results.json: context.executable: required"),
        ({**GB_SAMPLE, "context": {"executable": "/x/"}}, "results.json: context.date: required"),
        (
            {**GB_SAMPLE, "context": {"executable": "b", "date": "2024-01-02"}},
            "results.json: context.date: expected an ISO 8601 time with a zone",
        ),
        (
            {**GB_SAMPLE, "context": {"executable": "b", "date": "1999-12-31T23:00:00Z"}},
            "results.json: context.date: time '1999-12-31T23:00:00Z' is not between 2000 and 2100",
        ),
        (
            {**GB_SAMPLE, "context": {"executable": "b", "date": "2024/13/02-03:04:05"}},
            "results.json: context.date: not a date: month must be in 1..12",
        ),
        (entry(name="e", wallTime="NaN"), "results.json: entries.entry[1].wallTime: not a finite number: nan"),
        (entry(name="e", wallTime="Infinity"), "results.json: entries.entry[1].wallTime: not a finite number"),
        (entry(name="e", iters="1e3"), "results.json: entries.entry[1].iters: expected a whole number, got '1e3'"),
        (entry(name="e", cpuTime=-0.5), "results.json: entries.entry[1].cpuTime: must not be negative"),
        (entry(name="e", throughput={}), "results.json: entries.entry[1].throughput: not a number: {}"),
        (entry(wallTime=1), "results.json: entries.entry[1].name: required"),
        (entry(name="ok"), "results.json: entries.entry[1].name: 'ok' appears twice"),
        (entry(name="e", extras=[]), "results.json: entries.entry[1].extras: expected an object, got a list"),
        (entry(name="e", extras={"k": 1}), "results.json: entries.entry[1].extras.k: expected an object, got a number"),
        (entry(name="e", extras={"k": {"doubleValue": "x"}}), "entries.entry[1].extras.k.doubleValue: not a number"),
        (entry(name="e", extras={"k": {"stringValue": 5}}), "entries.entry[1].extras.k.stringValue: expected a string"),
        (entry(name="e", extras={"k": {"intValue": 5}}), 'entries.entry[1].extras.k: expected {"doubleValue": x}'),
        (entry(name="e", extras={"\x00": {"doubleValue": 1}}), "extras.\ufffd: contains NUL or a lone surrogate"),
        (
            entry(name="e", extras={f"k{i}": {"doubleValue": i} for i in range(101)}),
            "results.json: entries.entry[1].extras.k100: at most 100 extras per entry",
        ),
        ({**TF_SAMPLE, "entries": []}, "results.json: entries: expected an object, got a list"),
        ({**TF_SAMPLE, "entries": {"entry": {}}}, "results.json: entries.entry: expected a list, got an object"),
        ({**TF_SAMPLE, "startTime": "soon"}, "results.json: startTime: not a number: 'soon'"),
        ({**TF_SAMPLE, "startTime": 5}, "results.json: startTime: start 1970-01-01T00:00:05+00:00 is not between"),
        ({**TF_SAMPLE, "startTime": 1e300}, "results.json: startTime: not a time"),
        ({k: v for k, v in TF_SAMPLE.items() if k != "startTime"}, "results.json: startTime: required"),
        ({"entries": {}, "startTime": 1700000000}, "results.json: name: required"),
        ({**TF_SAMPLE, "name": 7}, "results.json: name: expected a string, got a number"),
        ([], "results.json: (top level): expected an object, got a list"),
        ({"hello": 1}, "results.json: not a result file: expected TensorFlow TestResults"),
        (b"{nope", "results.json: not valid JSON"),
        (b'{"entries": NaN}', "results.json: not valid JSON: NaN is not JSON"),
        (b'{"entries": -Infinity}', "results.json: not valid JSON: -Infinity is not JSON"),
        (b"\xff\xfe\xfa", "results.json: not valid JSON"),
        (b"[" * 40 + b"]" * 40, "results.json: JSON nested deeper than 32 levels"),
        (b"[" * 100000 + b"]" * 100000, "results.json: JSON nested deeper than 32 levels"),
        (b'{"benchmarks": [], "context": {"n": 1' + b"1" * 5000 + b"}}", "results.json: not valid JSON"),
    ],
)  # fmt: skip
def test_every_error_names_the_file_and_the_field(doc, expected):
    if expected is None:
        parse_result_file("results.json", raw(doc))
    else:
        assert expected in error_of(doc)
        assert error_of(doc).startswith("results.json: ")


def test_too_large_a_file_is_refused_before_it_is_read():
    data = b" " * MAX_RESULT_FILE_BYTES + raw(TF_SAMPLE)
    assert error_of(data, "big.json") == f"big.json: larger than {MAX_RESULT_FILE_BYTES} bytes ({len(data)})"


def test_too_many_entries_are_refused():
    rows = [{"name": f"b{i}", "real_time": 1} for i in range(MAX_ENTRIES + 1)]
    message = error_of({**GB_SAMPLE, "benchmarks": rows})
    assert message == f"results.json: benchmarks: at most {MAX_ENTRIES} items, got {MAX_ENTRIES + 1}"
    rows = rows[:MAX_ENTRIES]
    assert len(parse_result_file("results.json", raw({**GB_SAMPLE, "benchmarks": rows})).entries) == MAX_ENTRIES


def test_unsafe_text_in_the_info_and_extras_is_cleaned_not_refused():
    doc = {
        **TF_SAMPLE,
        "machineConfiguration": {"host\x00name": "dut\ud8001", "list": ["a\x00"]},
        "entries": {"entry": [{"name": "e", "wallTime": 1, "extras": {"k": {"stringValue": "v\x00"}}}]},
    }
    run = parse_result_file("tf.json", json.dumps(doc).encode())
    assert run.info["machineConfiguration"] == {"host\ufffdname": "dut\ufffd1", "list": ["a\ufffd"]}
    assert run.entries[0].extras == {"k": "v\ufffd"}
    context = {**GB_SAMPLE["context"], "cpu\x00": "x\ud800"}
    run = parse_result_file("gb.json", json.dumps({**GB_SAMPLE, "context": context}).encode())
    assert run.info["cpu\ufffd"] == "x\ufffd"


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=30,
    )
)
def test_any_json_value_in_any_field_parses_or_names_the_file(value):
    for doc in (
        {**TF_SAMPLE, "entries": {"entry": [value]}},
        {**TF_SAMPLE, "entries": {"entry": [{"name": "e", "wallTime": value, "extras": {"k": value}}]}},
        {**TF_SAMPLE, "startTime": value},
        {**GB_SAMPLE, "benchmarks": [value]},
        {**GB_SAMPLE, "benchmarks": [{"name": "b", "real_time": value, "iterations": value, "c": value}]},
        {**GB_SAMPLE, "context": {"executable": value, "date": value}},
        value,
    ):
        try:
            data = json.dumps(doc).encode()
        except ValueError:
            continue
        try:
            run = parse_result_file("f.json", data)
        except ResultFormatError as exc:
            assert str(exc).startswith("f.json: ")
            continue
        for e in run.entries:
            for number in (e.wall_time_s, e.cpu_time_s, e.throughput):
                assert number is None or 0 <= number < float("inf")
        json.dumps(run.info, allow_nan=False)


plain_values = (
    st.none() | st.booleans() | st.integers(min_value=-5, max_value=2**64) | st.floats() | st.text(max_size=4)
)


@settings(max_examples=300, deadline=None)
@example(name="\x00", values={"wallTime": 1.0})
@given(
    name=st.text(max_size=3) | st.just("x" * 255) | st.just("x" * 256) | st.just(" ") | st.integers(),
    values=st.fixed_dictionaries(
        {}, optional={k: plain_values for k in ("wallTime", "cpuTime", "throughput", "iters", "extras")}
    ),
)
def test_the_quick_read_of_a_plain_entry_is_what_the_full_read_makes(name, values):
    """tensorflow._plain_entry takes only entries it can read exactly as _entry does, and leaves the rest
    (extras, ints as times, NaN, out of range, bad names) to _entry, which refuses them naming the field."""
    from common.result_formats.records import Reader, plain_bytes
    from common.result_formats.tensorflow import _entry, _plain_entry

    entry = {"name": name, **values}
    # Told plain only when a file holding this entry would be (a NUL in a name never is).
    plain = plain_bytes(json.dumps(entry, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    quick = _plain_entry(entry, Reader("f.json", plain=plain))
    try:
        full = _entry(entry, "entries.entry[0]", Reader("f.json"))
    except ResultFormatError:
        assert quick is None
        return
    assert quick is None or (quick == full and [type(v) for v in quick[:5]] == [type(v) for v in full[:5]])


@pytest.mark.parametrize(
    ("data", "plain"),
    [
        (b'{"a": "b"}', True),
        (b'{"a": "\\u0000"}', False),
        (b'{"a": "\\ud800"}', False),
        (b'{"a": "\xed\xa0\x80"}', False),  # a surrogate in UTF-8, which json reads with surrogatepass
        ('{"a": "b"}'.encode("utf-16"), False),
        (b'{"a": "\\\\u"}', False),  # an escaped backslash before u: refused too (the slow way, never wrong)
    ],
)
def test_plain_bytes_is_true_only_where_no_string_can_hold_nul_or_a_surrogate(data, plain):
    from common.result_formats.records import plain_bytes

    assert plain_bytes(data) is plain


def test_a_name_with_nul_or_a_surrogate_is_refused_whichever_way_the_file_is_read():
    for body in (
        b'{"name": "t", "startTime": 1700000000, "entries": {"entry": [{"name": "a\\u0000"}]}}',
        b'{"name": "t", "startTime": 1700000000, "entries": {"entry": [{"name": "a\\udc00", "wallTime": 1.0}]}}',
        b'{"name": "t", "startTime": 1700000000, "entries": {"entry": [{"name": "a\xed\xb0\x80", "wallTime": 1.0}]}}',
    ):
        with pytest.raises(ResultFormatError, match="contains NUL or a lone surrogate"):
            parse_result_file("f.json", body)
