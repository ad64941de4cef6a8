"""The REST API's JSON parser: DRF's, with the wire's bound on nesting (docs/protocol.md, "Values").

Python's json module recurses once per level, so a body of 100,000 '[' raises RecursionError, which
DRF's JSONParser does not catch (a 500). `common.wire.loads` turns that, and any body nested deeper
than 32 levels, into an error that names the body: here a 400.
"""

from collections.abc import Mapping
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from common.wire import WireError, loads


class BoundedJSONParser(JSONParser):
    """DRF's JSONParser, refusing bodies nested deeper than 32 levels and bodies that are not UTF-8."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - the body is not UTF-8: {exc}") from None
        try:
            return loads(text)
        except WireError as exc:
            raise ParseError(f"JSON parse error - {exc.message}") from None
