"""A password is never shown, however its URL spells it (``tuner.urls``).

Database drivers take a password with an unencoded ``#``, ``/``, ``?`` or ``@``, and schemes in
any case; ``shown_url`` hides it all the same, for every scheme tuner is given (hypothesis over
the spellings), and so do the lines built from a URL: a ``--gpus`` worker's command, a library's
error naming the URL or a piece of it, an error tuner did not expect. All fast: no server, no
engine.
"""

from __future__ import annotations

import argparse
import string
from urllib.parse import unquote

import httpx
import pytest
import sqlalchemy
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.cli import gpus
from tuner.cli.children import Child
from tuner.cli.main import _hide_secrets, main
from tuner.engine.environment import Gpu
from tuner.study.plan.layouts import Layout
from tuner.study.store.storage import open_failure
from tuner.urls import MASK, shown_command, shown_text, shown_url, url_secrets

CORE = "hunter2"
"""What every generated password holds: it must be on no line shown."""
SCHEMES = [
    "postgresql", "PostgreSQL", "postgresql+psycopg", "POSTGRESQL+psycopg2", "mysql",
    "MySQL+pymysql", "mariadb", "mssql+pyodbc", "oracle", "cockroachdb", "sqlite", "http",
    "https", "HTTPS",
]  # fmt: skip
HOSTS = ["127.0.0.1:9", "db.example:5432", "[::1]:5432", "db", ""]
# Printable characters, the URL's own delimiters among them.
PASSWORD_CHARS = string.ascii_letters + string.digits + string.punctuation + " "


@st.composite
def urls(draw: st.DrawFn) -> tuple[str, str, str]:
    """``scheme://user:password@host/path?query``: the URL, its password and its host."""
    scheme = draw(st.sampled_from(SCHEMES))
    user = draw(st.text(string.ascii_letters + string.digits + "._-", max_size=8))
    side = st.text(PASSWORD_CHARS, max_size=12)
    password = draw(side) + CORE + draw(side)
    host = draw(st.sampled_from(HOSTS))
    tail = draw(st.sampled_from(["", "/", "/tuner", "/s?sslmode=require", "/api/v1/"]))
    return f"{scheme}://{user}:{password}@{host}{tail}", password, host


@settings(max_examples=600, deadline=None)
@given(urls())
def test_no_spelling_of_a_password_is_shown(drawn: tuple[str, str, str]) -> None:
    url, password, host = drawn
    shown = shown_url(url)
    assert CORE not in shown and password not in shown, shown
    assert host in shown and shown.endswith(url[url.rindex("@") :].replace(password, MASK))
    assert shown.startswith(url.partition(":")[0])
    # Whatever the password's reader takes for it is a part of what is hidden.
    try:
        is_http = url.lower().startswith("http")
        read = httpx.URL(url).password if is_http else sqlalchemy.make_url(url).password
    except (httpx.InvalidURL, ValueError):  # a port that is not a number, for the reader
        read = None
    assert read is None or read in unquote(password)
    # And a message that names the URL, its password or a piece of it hides each.
    said = f"cannot connect to {url}: host {url.rpartition('@')[0]!r}, password {password!r}"
    assert CORE not in shown_text(said, [url])


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:S3cr#tPW@127.0.0.1:9/db", "postgresql://u:***@127.0.0.1:9/db"),
        ("PostgreSQL://u:a/b?c@db/s", "PostgreSQL://u:***@db/s"),
        ("mysql://u:p@ss@db/s", "mysql://u:***@db/s"),
        ("sqlite://u:pw@/studies/s.db", "sqlite://u:***@/studies/s.db"),
        ("postgresql://db/s?sslpassword=x%23y&sslmode=require", "postgresql://db/s?sslpassword=***&sslmode=require"),
        ("postgresql://db/s?PASSWORD=a#b", "postgresql://db/s?PASSWORD=***"),
        ("https://prom/?api_key=k&token=t", "https://prom/?api_key=***&token=***"),
        ("postgresql://db/s?a=1;password=x&b=2", "postgresql://db/s?a=1;password=***&b=2"),
        ("postgresql://db/s?password=a;token=b&c=d", "postgresql://db/s?password=***&c=d"),
        ("journal:studies/s.log", "journal:studies/s.log"),
        ("sqlite:///studies/s.db", "sqlite:///studies/s.db"),
        ("http://prom:9090/", "http://prom:9090/"),
    ],
)  # fmt: skip
def test_each_spelling_shows_its_url_without_the_password(url: str, shown: str) -> None:
    assert shown_url(url) == shown


def test_a_readers_message_naming_a_piece_of_the_password_hides_it() -> None:
    url = "http://u:S3cr#tPW@127.0.0.1:9"
    with pytest.raises(httpx.InvalidURL) as raised:
        httpx.URL(url)
    assert "S3cr" in str(raised.value)
    assert "S3cr" not in shown_text(str(raised.value), [url])
    # SQLAlchemy reads the password up to its first '@': the rest is the host it names.
    url = "postgresql://u:p4ss@w0rd@127.0.0.1:9/s"
    assert sqlalchemy.make_url(url).host == "w0rd@127.0.0.1"
    said = 'could not translate host name "w0rd@127.0.0.1" to address'
    assert "w0rd" not in shown_text(said, [url])
    assert set(url_secrets(url)) >= {"p4ss@w0rd", "p4ss%40w0rd", "w0rd"}


def test_a_storage_that_cannot_be_opened_names_no_piece_of_its_password() -> None:
    url = "postgresql://tuner:S3cr#tPW@db:9/s"
    failure = open_failure(url, sqlalchemy.exc.ArgumentError(f"cannot parse {url}: S3cr"))
    assert "S3cr" not in failure and failure.startswith("cannot open the study storage")


def test_an_error_tuner_did_not_expect_names_no_password() -> None:
    url = "postgresql://tuner:S3cr#tPW@db:9/s"
    try:
        try:
            raise ValueError(f"bad port 'S3cr' in {url}")
        except ValueError as inner:
            raise RuntimeError("opening failed", url) from inner
    except RuntimeError as exc:
        _hide_secrets(exc, [url])
        assert exc.__cause__ is not None
        for each in (exc, exc.__cause__):
            assert "S3cr" not in str(each) and "db:9/s" in str(each)


def test_a_server_url_httpx_cannot_read_is_bad_input_naming_no_password(capsys) -> None:
    code = main(["run", "--trace", "t.csv", "--server-url", "http://u:S3cr#tPW@127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 2 and "S3cr" not in err
    assert err.startswith("tuner: --server-url http://u:***@127.0.0.1:9: not a URL httpx")


WORKER_URLS = [
    "mariadb://tuner:S3cr#tPW@db/s",
    "mssql+pyodbc://sa:S3cr/tPW@db:1433/s?driver=ODBC+Driver+18",
    "oracle://tuner:S3cr?tPW@db:1521/s",
    "cockroachdb://tuner:S3crtPW@db:26257/s",
    "PostgreSQL://tuner:S3crtPW@db/s",
    "MYSQL://tuner:S3crtPW@db/s",
    "sqlite://u:S3crtPW@/studies/s.db",
]


@pytest.mark.parametrize("url", WORKER_URLS)
def test_a_workers_command_names_no_password(url: str) -> None:
    child = Child(
        ["python", "-m", "tuner.cli", "run", "--storage", url], (Gpu(0, "GPU-0", "H100", 80),)
    )
    said = child.said()
    assert "S3cr" not in said and said.startswith("CUDA_VISIBLE_DEVICES=0 tuner run --storage ")
    assert shown_command(["run", f"--server-url={url}"]) == f"run --server-url={shown_url(url)}"


@pytest.mark.parametrize("url", WORKER_URLS[:3])
def test_gpus_prints_each_workers_command_without_the_password(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``tuner run --gpus`` prints of its workers and its confirmation (the workers'
    processes not started: their exit statuses given)."""
    started: list[list[Child]] = []

    def run_all(children: list[Child]) -> list[int]:
        started.append(children)
        return [0] * len(children)

    monkeypatch.setattr(gpus, "run_all", run_all)
    two = [Gpu(i, f"GPU-{i}", "NVIDIA H100", 81559) for i in range(2)]
    base = ["python", "-m", "tuner.cli", "run", "--trace", "t.csv", "--storage", url]
    args = argparse.Namespace(time_budget_s=None)
    code = gpus._search_and_confirm(args, two, Layout(1, 1), base, 4, "s", url, 0.0)
    out = capsys.readouterr().out
    assert code == 0 and len(started) == 2 and len(started[0]) == 2
    assert "S3cr" not in out and out.count("--storage") == 3, out
    assert all(url in child.argv for children in started for child in children)
