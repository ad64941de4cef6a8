"""Bidirectional controls out of every HTML page: a test name, job name or failure a job wrote with a
U+202E in it would otherwise read backwards on the admin's pages (a name that looks like another).

Job-controlled text reaches the pages through many fields and templates; every page passes here, so
none can forget. The pages' own text has no such characters, so each is shown as its escape
(`\\u202e`), as the command line shows it, rather than acted on.
"""

import re
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def shown(text: str) -> str:
    return BIDI_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class BidiControlsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.streaming or not response.get("Content-Type", "").startswith("text/html"):
            return response
        charset = response.charset or "utf-8"
        text = response.content.decode(charset, errors="surrogateescape")
        if BIDI_CONTROLS.search(text):
            response.content = shown(text).encode(charset, errors="surrogateescape")
            if response.has_header("Content-Length"):
                response["Content-Length"] = str(len(response.content))
        return response
