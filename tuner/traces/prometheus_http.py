"""How ``tuner trace from-prometheus`` talks to Prometheus: credentials, TLS, and answers.

``Access`` holds what every query sends and trusts; ``read_access`` builds it from the
command line's options, which follow Prometheus' own HTTP client configuration
(``http_config``): extra headers, a bearer token or a basic-auth password read from a file
(its content with surrounding white space trimmed, so a secret never sits on a command line),
a CA file to verify the server's certificate against, or no verification at all; as there, at
most one way of authorising.

``Connection`` sends the queries through ``prometheus-api-client``'s ``PrometheusConnect``
and turns each answer into its ``data.result`` or a one-line error: ``InputError`` for a query
Prometheus refuses, ``TunerError`` for a server that cannot be reached or verified, refuses
the credentials, or answers without its API's JSON.
"""

from __future__ import annotations

import re
import ssl
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import requests
from urllib3.exceptions import InsecureRequestWarning
from urllib3.util.retry import Retry

from tuner.errors import InputError, TunerError
from tuner.urls import shown_text, shown_url

if TYPE_CHECKING:
    from prometheus_api_client import PrometheusConnect

QUERY_TIMEOUT_S = 60
QUERY_ERRORS = ("bad_data", "execution")
"""Prometheus' error types that mean the query itself is wrong (bad input), not the server."""

AUTH_OPTIONS = (
    "--basic-auth-user and --basic-auth-password-file, --bearer-token-file, "
    "or --header 'Authorization: ...'"
)
"""The options that give credentials, as messages name them."""

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP header name (RFC 9110's token)."""

Result = list[Mapping[str, Any]]


@dataclass(frozen=True)
class Access:
    """What every query sends and trusts; the defaults reach an open Prometheus.

    ``headers`` go with each request (``Authorization`` for a bearer token among them);
    ``basic_auth`` is ``(user, password)``; an HTTPS server's certificate is checked against
    ``ca_file`` (else the system's CAs) unless ``insecure``. Secrets stay out of ``repr``.
    """

    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    ca_file: Path | None = None
    insecure: bool = False

    @property
    def verify(self) -> bool | str:
        """``requests``' ``verify``: off, a CA bundle's path, or the system's CAs."""
        if self.insecure:
            return False
        return str(self.ca_file) if self.ca_file else True

    @property
    def has_credentials(self) -> bool:
        return self.basic_auth is not None or any(
            name.lower() == "authorization" for name in self.headers
        )


def parse_header(text: str) -> tuple[str, str]:
    """``Name: value`` as ``(name, value)``; ``ValueError`` names what is wrong."""
    name, colon, value = text.partition(":")
    name = name.strip()
    if not colon or not _TOKEN.fullmatch(name):
        # The text is not echoed: it may hold a secret.
        raise ValueError("expected 'Name: value': a header name, a colon, then its value")
    return name, value.strip()


def _secret(option: str, path: Path) -> str:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {option} {path}: {exc.__class__.__name__}") from None
    if not text:
        raise InputError(f"{option} {path} is empty")
    return text


def _ca_file(path: Path) -> Path:
    """``path`` if it holds at least one certificate that TLS can load."""
    try:
        ssl.create_default_context(cafile=str(path))
    except FileNotFoundError:
        raise InputError(f"--ca-file {path} does not exist") from None
    except (OSError, ssl.SSLError) as exc:
        reason = " ".join(str(exc).split())
        raise InputError(f"--ca-file {path} holds no usable certificate: {reason}") from None
    return path


def read_access(
    headers: Sequence[tuple[str, str]] = (),
    *,
    bearer_token_file: Path | None = None,
    basic_auth_user: str | None = None,
    basic_auth_password_file: Path | None = None,
    ca_file: Path | None = None,
    insecure: bool = False,
) -> Access:
    """The ``Access`` the command line's options describe, its files read.

    Raises ``InputError`` for an unreadable or empty secret file, a CA file without a
    certificate, a header given twice, more than one way of authorising, a password file
    without a user, or ``--ca-file`` with ``--insecure``.
    """
    sent: dict[str, str] = {}
    for name, value in headers:
        if name.lower() in (given.lower() for given in sent):
            raise InputError(f"--header {name} is given twice")
        sent[name] = value
    if basic_auth_password_file is not None and basic_auth_user is None:
        raise InputError("--basic-auth-password-file needs --basic-auth-user")
    ways = [
        option
        for option, given in (
            ("--header Authorization", any(n.lower() == "authorization" for n in sent)),
            ("--bearer-token-file", bearer_token_file is not None),
            ("--basic-auth-user", basic_auth_user is not None),
        )
        if given
    ]
    if len(ways) > 1:
        raise InputError(f"give one way of authorising, not {' and '.join(ways)}")
    if ca_file is not None and insecure:
        raise InputError("--ca-file and --insecure contradict each other: give one")
    if bearer_token_file is not None:
        sent["Authorization"] = f"Bearer {_secret('--bearer-token-file', bearer_token_file)}"
    basic_auth = None
    if basic_auth_user is not None:
        password = ""  # as Prometheus' basic_auth: a user without a password file sends none
        if basic_auth_password_file is not None:
            password = _secret("--basic-auth-password-file", basic_auth_password_file)
        basic_auth = (basic_auth_user, password)
    return Access(
        headers=sent,
        basic_auth=basic_auth,
        ca_file=_ca_file(ca_file) if ca_file is not None else None,
        insecure=insecure,
    )


def _result(url: str, response: requests.Response) -> Result:
    """The ``data.result`` of a Prometheus API answer; its error envelope as a one-line error."""
    try:
        body = response.json()
    except ValueError:
        text = " ".join(response.text.split())[:120]
        raise TunerError(
            f"Prometheus at {url} answered HTTP {response.status_code}, not with its API's JSON: "
            f"{text!r}"
        ) from None
    if not isinstance(body, dict):
        raise TunerError(f"Prometheus at {url} answered with {type(body).__name__}, not an object")
    if body.get("status") != "success":
        kind = str(body.get("errorType", "unknown"))
        reason = " ".join(str(body.get("error", "no reason given")).split())
        if kind in QUERY_ERRORS:
            raise InputError(f"Prometheus at {url} refused the query: {kind}: {reason}")
        raise TunerError(f"Prometheus at {url} failed the query: {kind}: {reason}")
    data = body.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list):
        raise TunerError(f"Prometheus at {url} answered without data.result")
    return result


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: chained exceptions, and those that ``requests`` and
    ``urllib3`` keep in their arguments or ``reason`` instead of chaining them."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        cause = todo.pop(0)
        if id(cause) in seen:
            continue
        seen.add(id(cause))
        yield cause
        inner = [cause.__cause__, cause.__context__, getattr(cause, "reason", None), *cause.args]
        todo += [e for e in inner if isinstance(e, BaseException)]


def _unreachable(url: str, exc: requests.RequestException) -> TunerError:
    """The one-line error for a request that got no answer; TLS verification names --insecure.
    requests and urllib3 name the URL they were given, or a piece of it (the host and port they
    read from it): each is said through ``tuner.urls.shown_text``, no password in it."""
    shown = shown_url(url)
    for cause in _causes(exc):
        if isinstance(cause, ssl.SSLCertVerificationError):
            said = shown_text(str(cause.verify_message or cause.reason), [url]).rstrip(".")
            return TunerError(
                f"cannot verify the TLS certificate of Prometheus at {shown}: {said}; "
                "--ca-file names the CA that signed it, --insecure skips the check"
            )
    root = list(_causes(exc))[-1]
    reason = shown_text(" ".join(str(root).split()), [url])
    return TunerError(f"cannot reach Prometheus at {shown}: {type(exc).__name__}: {reason}")


class Connection:
    """``PrometheusConnect`` with each answer checked: the query's result or a one-line error.

    The client raises one exception for every answer but HTTP 200 and keeps only its repr;
    the response itself, kept by a hook of the session, gives Prometheus' own error. No
    retries: the client's default would re-send on HTTP 5xx and lose Prometheus' reason.
    """

    def __init__(self, url: str, access: Access) -> None:
        self.url = url
        self.shown = shown_url(url)  # what messages name: no password
        self.with_credentials = access.has_credentials
        self.insecure = access.insecure
        self.last: requests.Response | None = None
        self.session = requests.Session()
        self.session.verify = access.verify
        self.session.hooks["response"].append(self._keep)
        # Imported where a query is made: every other command runs without the client.
        try:
            from prometheus_api_client import PrometheusConnect
        except ImportError:
            raise TunerError(
                "reading Prometheus needs prometheus-api-client, which is not installed here: "
                "pip install 'prometheus-api-client>=0.7,<0.8'"
            ) from None

        self.client = PrometheusConnect(
            url,
            headers=dict(access.headers),
            auth=access.basic_auth,
            session=self.session,
            retry=Retry(total=0, raise_on_status=False),
            timeout=QUERY_TIMEOUT_S,
        )

    def _keep(self, response: requests.Response, *args: object, **kwargs: object) -> None:
        self.last = response

    def query(self, promql: str, at_s: float) -> Result:
        """An instant query: ``promql`` evaluated at ``at_s``, epoch seconds."""
        return self._ask(lambda c: c.custom_query(promql, params={"time": at_s}))

    def query_range(self, promql: str, start_s: float, end_s: float, step: str) -> Result:
        """A range query, evaluated every ``step`` (``"15s"``) from ``start_s`` on."""
        # The client rounds start and end to whole seconds; its params override them with
        # the exact times, so that the grid starts where the range does.
        first, last = datetime.fromtimestamp(start_s, UTC), datetime.fromtimestamp(end_s, UTC)
        exact = {"start": start_s, "end": end_s}
        return self._ask(lambda c: c.custom_query_range(promql, first, last, step, params=exact))

    def _ask(self, send: Callable[[PrometheusConnect], object]) -> Result:
        from prometheus_api_client import PrometheusApiClientException

        self.last = None
        try:
            with warnings.catch_warnings():
                if self.insecure:  # asked for: urllib3 would warn on every request
                    warnings.simplefilter("ignore", InsecureRequestWarning)
                result = send(self.client)
        except (PrometheusApiClientException, ValueError, KeyError, TypeError) as exc:
            # An answer other than HTTP 200 with the API's JSON (requests' JSON error is a
            # ValueError too), or a URL requests cannot send to (no answer).
            if self.last is None:
                if isinstance(exc, requests.RequestException):
                    raise _unreachable(self.url, exc) from None
                raise
            if self.last.status_code in (401, 403):
                raise self._unauthorised(self.last) from None
            _result(self.shown, self.last)  # Prometheus' own error, or what the answer lacks
            raise TunerError(
                f"Prometheus at {self.shown} answered HTTP {self.last.status_code}, not a result"
            ) from None
        except requests.RequestException as exc:
            raise _unreachable(self.url, exc) from None
        if not isinstance(result, list):
            raise TunerError(f"Prometheus at {self.shown} answered without data.result")
        return result

    def _unauthorised(self, response: requests.Response) -> TunerError:
        said = f"Prometheus at {self.shown} answered HTTP {response.status_code} {response.reason}"
        if self.with_credentials:
            return TunerError(f"{said} to the credentials given ({AUTH_OPTIONS})")
        return TunerError(f"{said}: it needs credentials: {AUTH_OPTIONS}")

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
