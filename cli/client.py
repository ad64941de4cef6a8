"""The command line's HTTP client for the REST API: turns every failure into one clear sentence."""

from typing import Any
from urllib.parse import quote

import click
import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from common.network import request_failure

DEFAULT_SERVER = "http://127.0.0.1:8000"
API_PREFIX = "/api/v1"


class CliError(click.ClickException):
    """A failure the user can act on: printed as one line on stderr, exit status 1."""

    def __init__(self, message: str, status: int | None = None, reply: str | None = None, exit_code: int = 1) -> None:
        # The master's messages quote what users gave it: shown, never acted on by the terminal.
        from cli.output import printable

        super().__init__(printable(message))
        self.status = status  # the HTTP status that caused it; None when no answer came
        self.reply = reply  # the API's own error message, as it sent it
        self.exit_code = exit_code  # type: ignore[misc]  # cli/errors.py: 1, or TIMED_OUT for a wait that ran out


def segment(name: str | int) -> str:
    """A name as one path segment: label names hold ':' and hostnames may hold anything but '/'."""
    try:
        return quote(str(name), safe="")
    except UnicodeEncodeError:
        raise CliError(not_utf8(str(name))) from None


def not_utf8(text: str) -> str:
    """Said of an argument with a byte the terminal's encoding could not read (a surrogate in argv)."""
    return f"{text[:80]!r} is not valid UTF-8: nothing was sent"


def _retrying_session() -> requests.Session:
    # Reads are idempotent, so a hiccup (a restarting server, a dropped connection) is retried;
    # writes are retried only when the connection failed, i.e. when nothing reached the server.
    retry = Retry(
        total=3,
        connect=3,
        read=2,
        status=2,
        backoff_factor=0.2,
        status_forcelist=(502, 503, 504),
        allowed_methods=frozenset({"GET"}),
        raise_on_status=False,
    )
    session = requests.Session()
    adapter = HTTPAdapter(max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class Api:
    def __init__(self, server: str, token: str | None, timeout: float = 30.0) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.session = _retrying_session()
        self.total = 0  # the object count of the last list(), for "showing N of M"

    def require_token(self) -> None:
        if not self.token:
            raise CliError(
                "no API token: set FLEETSHARD_TOKEN or pass --token "
                "(an administrator creates one with `manage.py create_token USERNAME`)"
            )

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        data: bytes | None = None,
    ) -> Any:
        """`body` is sent as JSON; `data` (a file's raw bytes) as it is."""
        self.require_token()
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/octet-stream"
        url = path if path.startswith(("http://", "https://")) else f"{self.server}{API_PREFIX}{path}"
        try:
            resp = self.session.request(
                method,
                url,
                params=params,
                json=body if data is None else None,
                data=data,
                headers=headers,
                timeout=(5, self.timeout),
                allow_redirects=False,
            )
        except requests.exceptions.RequestException as exc:
            raise self._unreachable(exc) from None
        except UnicodeEncodeError as exc:
            # A byte the terminal's encoding could not read (argv's surrogates), in a query or a path.
            raise CliError(not_utf8(exc.object if isinstance(exc.object, str) else "")) from None
        return self._result(resp)

    def _unreachable(self, exc: requests.exceptions.RequestException, broke_off: bool = False) -> CliError:
        """A request that got no answer, as one line naming the cause: TLS, time, or no connection."""
        if isinstance(exc, requests.exceptions.MissingSchema | requests.exceptions.InvalidSchema):
            return CliError(f"invalid server URL {self.server!r}: use http://HOST:PORT")
        if isinstance(exc, requests.exceptions.InvalidURL):
            return CliError(f"invalid server URL {self.server!r}: use http://HOST:PORT")
        cause = request_failure(exc)
        if isinstance(exc, requests.exceptions.SSLError):
            plain = "; it may serve plain HTTP: try http://" if self.server.startswith("https://") else ""
            return CliError(f"TLS failed with the fleetshard server at {self.server} ({cause}){plain}")
        if isinstance(exc, requests.exceptions.Timeout):
            return CliError(f"the fleetshard server at {self.server} did not answer within {self.timeout:g} s")
        if broke_off and cause == "the answer broke off":
            return CliError(f"the fleetshard server at {self.server} broke off its answer: try again")
        return CliError(
            f"cannot reach the fleetshard server at {self.server} ({cause}): "
            "is it running? set --server or FLEETSHARD_SERVER"
        )

    def _result(self, resp: requests.Response) -> Any:
        if resp.status_code == 204:
            return None
        try:
            data = resp.json()
        except ValueError:
            data = None
        if resp.ok and data is not None:
            return data
        message = data.get("error") if isinstance(data, dict) else None
        status = resp.status_code
        if status == 401:
            raise CliError(
                f"the server at {self.server} refused the token ({message or 'not authenticated'}): "
                "check FLEETSHARD_TOKEN or --token",
                status,
                message,
            )
        if status == 403:
            raise CliError(f"permission denied: {message or 'not allowed'}", status, message)
        if message:
            raise CliError(str(message), status, str(message))
        if 300 <= status < 400:
            # A redirect is never the API's answer: the URL is not a master's base URL (the admin's
            # login page, a proxy sending http to https).
            raise CliError(
                f"the server at {self.server} redirected {resp.request.method} {resp.url} to "
                f"{resp.headers.get('Location') or 'elsewhere'}: --server must be the master's base URL, "
                "such as http://HOST:8000",
                status,
            )
        if status >= 500:
            raise CliError(
                f"the server at {self.server} failed ({status} {resp.reason}) on {resp.request.method} "
                f"{resp.url}; its log says why",
                status,
            )
        raise CliError(
            f"the server at {self.server} answered {status} {resp.reason} to {resp.request.method} "
            f"{resp.url}; is it a fleetshard master?",
            status,
        )

    def download(self, path: str, target: Any, params: dict[str, Any]) -> int:
        """Streams a GET's body into the binary file `target` as it arrives; returns the bytes written.
        Long answers (a timeline export) may take minutes: only the wait for each piece is bounded."""
        self.require_token()
        url = f"{self.server}{API_PREFIX}{path}"
        try:
            resp = self.session.get(
                url,
                params=params,
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=(5, self.timeout),
                stream=True,
                allow_redirects=False,
            )
            if not resp.ok:
                self._result(resp)
            written = 0
            for piece in resp.iter_content(1 << 16):
                target.write(piece)
                written += len(piece)
            return written
        except requests.exceptions.RequestException as exc:
            raise self._unreachable(exc, broke_off=True) from None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body=body if body is not None else {})

    def list(self, path: str, limit: int | None = None, **params: Any) -> list[dict[str, Any]]:
        """Every object of a list endpoint (or the first `limit`), following the pages."""
        page_size = min(limit, 1000) if limit else 1000
        page = self.get(path, limit=page_size, **params)
        items: list[dict[str, Any]] = list(page["results"])
        self.total = page["count"]
        while page.get("next") and (not limit or len(items) < limit):
            page = self.request("GET", page["next"])
            items.extend(page["results"])
        return items[:limit] if limit else items
