"""Result files in, `ParsedRun` out: the format is recognised by content, never by the file's name."""

from common.constants import MAX_RESULT_FILE_BYTES
from common.result_formats import google_benchmark, tensorflow
from common.result_formats.records import (
    MAX_ENTRIES,
    ParsedEntry,
    ParsedRun,
    Reader,
    ResultFormatError,
    plain_bytes,
)
from common.wire import WireError, loads

__all__ = ["MAX_ENTRIES", "ParsedEntry", "ParsedRun", "ResultFormatError", "parse_result_file"]


def parse_result_file(name: str, data: bytes) -> ParsedRun:
    """Parses one result file; `name` (the file's name) is only used in error messages."""
    r = Reader(name, plain=plain_bytes(data))
    if len(data) > MAX_RESULT_FILE_BYTES:
        raise r.fail("", f"larger than {MAX_RESULT_FILE_BYTES} bytes ({len(data)})")
    try:
        doc = loads(data)
    except WireError as exc:
        raise r.fail("", exc.message) from None
    doc = r.obj(doc, "(top level)")
    if google_benchmark.looks_like(doc):
        return google_benchmark.parse(doc, r)
    if tensorflow.looks_like(doc):
        return tensorflow.parse(doc, r)
    raise r.fail(
        "",
        "not a result file: expected TensorFlow TestResults (`entries`) or Google Benchmark JSON"
        " (`context` and `benchmarks`)",
    )
