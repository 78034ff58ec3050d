"""URLs as tuner shows them: a password in one never reaches a terminal, a log or a file.

``shown_url`` is the one function through which every URL tuner prints, logs or writes passes
(a study's storage, a Prometheus server): the password of its ``user:password@`` part, and the
value of any query parameter that names a secret, become ``***``.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
SECRET_PARAMETERS = frozenset({"password", "passwd", "pwd", "token", "access_token", "api_key"})
"""Query parameters whose values are secrets (as libpq, SQLAlchemy and HTTP APIs name them)."""


def shown_url(url: str) -> str:
    """``url`` with its password and secret query values replaced by ``***``; a text that is
    not a URL comes back as it is, past its first ``@`` masked where it could hold one."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a port that is not a number, brackets unbalanced
        head, at, rest = url.rpartition("@")
        return f"{head.partition(':')[0]}:{MASK}@{rest}" if at and ":" in head else url
    netloc = parts.netloc
    if password is not None:
        users, _, host = netloc.rpartition("@")
        netloc = f"{users.partition(':')[0]}:{MASK}@{host}"
    query = parts.query
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(key.lower() in SECRET_PARAMETERS for key, _ in pairs):
        masked = [(k, MASK if k.lower() in SECRET_PARAMETERS else v) for k, v in pairs]
        query = urlencode(masked, safe="*")
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
