"""URLs as tuner shows them: a password in one never reaches a terminal, a log or a file.

``shown_url`` is the one function through which every URL tuner prints, logs or writes passes
(a study's storage, a Prometheus server, a server tuner did not start): the password of its
``user:password@`` part, and the value of any query parameter that names a secret, become
``***``.

A password is found the way its readers find it, and more: database drivers take a password
with an unencoded ``#``, ``/``, ``?`` or ``@`` (SQLAlchemy's ``make_url`` reads the password up
to the next ``@``, then the host), where ``urllib.parse.urlsplit`` ends the host part at the
first ``#``, ``/`` or ``?`` and would show the rest of the password as a path. What is hidden
runs from the first ``:`` after the scheme's ``//`` to the last ``@``: it holds the password as
SQLAlchemy, httpx and urllib each read it, whatever the scheme or its case. A URL whose port
cannot be told from a password (``http://host:9090/x?a=b@c``) is shown with that part hidden.

Other text that may carry a password (an exception's message from SQLAlchemy, httpx or
requests, naming the URL or a piece of it) is shown through ``shown_text``; a command line
through ``shown_command``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from urllib.parse import quote, unquote, unquote_plus

MASK = "***"
SECRET_PARAMETERS = frozenset(
    {
        "password", "passwd", "pwd", "sslpassword", "token", "access_token", "auth_token",
        "api_key", "apikey", "secret", "client_secret",
    }
)  # fmt: skip
"""Query parameters whose values are secrets (as libpq, SQLAlchemy and HTTP APIs name them)."""

# ``scheme://`` in any case (``PostgreSQL+psycopg://``).
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
# A query parameter and its value, after each ``?``, ``&`` or ``;`` (a reader may split at
# either of the last two): the value up to the next ``&``, as SQLAlchemy and parse_qsl split a
# query (a ``#`` or ``;`` in a value is the value's, for SQLAlchemy). Matched where it starts,
# one inside another's value too.
_PARAMETER = re.compile(r"(?<=[?&;])(?=([^=&;]*)=([^&]*))")
# The characters that end a piece of a URL for some reader: a password cut there by one reader
# is shown by it in pieces (httpx's "Invalid port: 'S3cr'" of ``u:S3cr#tPW@host``).
_CUTS = re.compile(r"[#/?@:]")
# A secret, or a piece of one, at least this long is hidden wherever it appears in a message; a
# shorter one would hide the message's own words (a password 'p' every p of it). In a URL, a
# password of any length is hidden.
_PIECE = 4


def _password_span(url: str) -> tuple[int, int] | None:
    """Where the password of ``url`` lies (start and end), from the first ``:`` after the
    scheme's ``//`` (the start where there is none) to the last ``@``; None where it has none."""
    scheme = _SCHEME.match(url)
    start = scheme.end() if scheme else 0
    at = url.rfind("@", start)
    if at < 0:
        return None
    colon = url.find(":", start, at)
    return None if colon < 0 else (colon + 1, at)


def _password_hidden(url: str) -> str:
    """``url`` with its password (``_password_span``) replaced by ``***``."""
    span = _password_span(url)
    return url if span is None else f"{url[: span[0]]}{MASK}{url[span[1] :]}"


def _secret_values(url: str) -> list[tuple[int, int]]:
    """Where the values of secret query parameters lie in ``url`` (its password hidden)."""
    question = url.find("?")
    if question < 0:
        return []
    spans = sorted(
        match.span(2)
        for match in _PARAMETER.finditer(url, question)
        if unquote_plus(match.group(1)).strip().lower() in SECRET_PARAMETERS
    )
    merged: list[tuple[int, int]] = []
    for start, end in spans:  # one value inside another's: the outer one
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def shown_url(url: str) -> str:
    """``url`` with its password and secret query values replaced by ``***``; a text that is
    not a URL comes back as it is, between its first ``:`` and last ``@`` masked where it
    could hold a password there."""
    shown = _password_hidden(url)
    for start, end in reversed(_secret_values(shown)):
        shown = f"{shown[:start]}{MASK}{shown[end:]}"
    return shown


def url_secrets(url: str) -> tuple[str, ...]:
    """The secrets of ``url`` as any reader of it may write them in a message: its password as
    typed, decoded and encoded, as SQLAlchemy reads it (a database URL) and as httpx does (an
    HTTP one), the pieces of it a reader cuts at ``#``, ``/``, ``?``, ``@`` or ``:``, the values
    of its secret query parameters, and each as ``repr`` writes it in a message; those of at
    least four characters, longest first."""
    found: set[str] = set()
    span = _password_span(url)
    if span is not None:
        typed = url[span[0] : span[1]]
        found |= {typed, unquote(typed), quote(unquote(typed), safe="")}
        found |= {p for p in _CUTS.split(typed) if len(p) >= _PIECE}
        found.add(_read_password(url) or "")
        # The host and port a reader takes where it cuts the password short ('user:S' of
        # ``user:S#tPW@host``, urllib3's): the user, a colon and the password's first piece.
        scheme = _SCHEME.match(url)
        user = url[scheme.end() if scheme else 0 : span[0]]
        cuts = (m.start() for m in _CUTS.finditer(typed))
        found |= {user + typed[:cut] for cut in cuts if len(user) + cut >= _PIECE}
    shown = _password_hidden(url)
    for start, end in _secret_values(shown):
        value = shown[start:end]
        found |= {value, unquote_plus(value)}
    found |= {repr(each)[1:-1] for each in found}  # as a message quotes it, backslashes doubled
    kept = (each for each in found if len(each) >= _PIECE and each != MASK)
    return tuple(sorted(kept, key=len, reverse=True))


def _read_password(url: str) -> str | None:
    """The password of ``url`` as its reader takes it: httpx for an HTTP URL, SQLAlchemy's
    ``make_url`` for any other; None where the reader cannot read the URL."""
    if url.lower().startswith(("http://", "https://")):
        import httpx

        try:
            return httpx.URL(url).password or None
        except (httpx.InvalidURL, TypeError, ValueError):
            return None
    import sqlalchemy

    try:
        return sqlalchemy.make_url(url).password
    except (sqlalchemy.exc.ArgumentError, TypeError, ValueError):
        return None


def shown_text(text: str, urls: Iterable[str | None]) -> str:
    """``text`` (an exception's message, a line from a library) with each URL of ``urls`` shown
    through ``shown_url`` and every secret of theirs (``url_secrets``) replaced by ``***``,
    wherever it appears."""
    given = [url for url in urls if url]
    for url in sorted(given, key=len, reverse=True):
        text = text.replace(url, shown_url(url))
    secrets = sorted({s for url in given for s in url_secrets(url)}, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


def shown_command(words: Sequence[str]) -> str:
    """A command line as a person would type it, every URL in it (a word with ``://``, or an
    option's ``--name=URL``) shown through ``shown_url``."""
    return " ".join(_shown_word(word) for word in words)


def _shown_word(word: str) -> str:
    if word.startswith("--") and "=" in word:
        option, _, value = word.partition("=")
        return f"{option}={_shown_word(value)}"
    return shown_url(word) if "://" in word or "@" in word else word
