"""The REST API's JSON parser: DRF's, with a bound on nesting.

Python's json module recurses once per level, so a body of 100,000 '[' raises RecursionError,
which DRF's JSONParser does not catch (a 500). Nesting is measured before parsing, on the
brackets outside strings, so no depth of input reaches the decoder. DESIGN.md ("Values on the
wire") sets the bound: JSON nested deeper than 32 levels is a 400.
"""

import re
from itertools import accumulate
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.utils import json

MAX_DEPTH = 32

# A JSON string, escapes included (written unrolled so long strings need no backtracking).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def nesting_depth(text: str) -> int:
    """How deep arrays and objects nest in `text` (a top-level container is 1), ignoring brackets in strings."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


class BoundedJSONParser(JSONParser):
    """DRF's JSONParser, refusing bodies nested deeper than MAX_DEPTH and bodies that are not UTF-8."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - the body is not UTF-8: {exc}") from None
        if nesting_depth(text) > MAX_DEPTH:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_DEPTH} levels")
        try:
            return json.loads(text, parse_constant=json.strict_constant if self.strict else None)
        except (ValueError, RecursionError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
