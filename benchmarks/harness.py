"""A result of a benchmark, written as one folder of benchmarks/results/ (benchmarks/README.md,
"Results"): ``README.md`` whose first lines are the date, tuner's commit, the command that reruns
it and the machine, then what the script printed; ``summary.json`` where its figures are data;
the study's database where a study ran (``study.db``); and ``files.md``, the result's small
files one section each under its name: the last lines of each raw log (``NAME.tail.txt``), the
logs themselves staying out of git (benchmarks/results/.gitignore), and any file given whole
(a YAML tuner wrote, an environment), which leaves the folder for its section. One file in
place of many small ones: each would take a disk block of its own.

From a script of benchmarks/ (``sys.path`` holds its folder)::

    import harness
    with harness.Printed() as printed:
        ...                                   # print the figures as usual
    harness.write_result(harness.RESULTS / "NAME", "A title", harness.command_line(),
                         printed.text(), data=rows, study_db=db)

From a shell script, once its folder holds what the run wrote::

    python benchmarks/harness.py DIR --title "A title" --command "bash ..." \
        [--summary FILE] [--db FILE] [--tail LOG ...] [--file FILE ...] [--commit C] [--machine M]

Only the standard library: it runs on the device machines too, where tuner is a copied tree.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
# The lines of a raw log a result keeps (its end: the run's outcome and its last errors).
TAIL_LINES = 60
# The result's small files, one section each (``files_page``).
FILES = "files.md"
FILES_INTRO = (
    "Each section is one file of this result, under its name: the last lines of a raw log\n"
    "(`NAME.tail.txt`), or a small file whole. [README.md](README.md) says what they are.\n"
)
# A section's code block is marked as its file's kind, where Markdown has a name for it.
LANGUAGES = {".yaml": "yaml", ".yml": "yaml", ".json": "json", ".diff": "diff"}


def git_commit(repo: Path = REPO) -> str:
    """``git rev-parse --short HEAD`` of ``repo``, ``+changes`` where tracked files differ from
    it; ``unknown`` outside a git checkout (a tree copied to a device machine)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+changes" if dirty else "")


def machine() -> str:
    """The GPUs ``nvidia-smi`` names, else the CPU model and its cores."""
    try:
        gpus = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        gpus = []
    names = [g.strip() for g in gpus if g.strip()]
    if names:
        return ", ".join(f"{names.count(n)} x {n}" for n in dict.fromkeys(names))
    return f"{cpu_model()}, {os.cpu_count()} cores"


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The ``model name`` of ``/proc/cpuinfo``, or the platform's processor where it has none."""
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    import platform

    return platform.processor() or platform.machine()


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as typed to run this script: ``python benchmarks/NAME.py ARGS``, quoted."""
    args = list(sys.argv if argv is None else argv)
    script = Path(args[0]).resolve()
    with contextlib.suppress(ValueError):
        args[0] = str(script.relative_to(REPO))
    return "python " + shlex.join(args)


def header(
    title: str, command: str, *, commit: str, machine: str, when: datetime | None = None
) -> str:
    """A result's README header: the title, then date, commit, command and machine."""
    stamp = (when or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"# {title}\n\n"
        f"- Date: {stamp}\n"
        f"- Tuner commit: `{commit}`\n"
        f"- Command: `{command}`\n"
        f"- Machine: {machine}\n"
    )


def tail_name(log: Path) -> str:
    """The name of ``log``'s (``NAME.log``'s) last lines: ``NAME.tail.txt``."""
    return log.name.removesuffix(".log") + ".tail.txt"


def tail(log: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of ``log``, as they are (a carriage return stays one)."""
    text = log.read_bytes().decode(errors="replace")
    return "".join(text.splitlines(keepends=True)[-lines:])


def section(name: str, text: str) -> str:
    """One file of ``files.md``: a heading of its name, then its text as a code block whose
    fence is longer than any run of backticks in it. A text that does not end in a newline
    ends in one here."""
    if text and not text.endswith("\n"):
        text += "\n"
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    language = LANGUAGES.get(Path(name).suffix, "text")
    return f"## {name}\n\n{fence}{language}\n{text}{fence}\n"


def anchor(name: str) -> str:
    """The anchor of ``name``'s section in ``files.md`` (GitHub's, of its heading)."""
    return re.sub(r"[^\w\- ]", "", name.strip().lower()).replace(" ", "-")


def files_page(title: str, files: Sequence[tuple[str, str]], intro: str = FILES_INTRO) -> str:
    """``files.md``: ``title``, ``intro``, then a section per (name, text) of ``files``."""
    return f"# {title}\n\n{intro}" + "".join(f"\n{section(n, t)}" for n, t in files)


def keep_study(db: Path, folder: Path, name: str = "study.db") -> Path:
    """A copy of the SQLite study ``db`` as ``folder/name``, consistent while it is written
    (SQLite's backup) and VACUUMed."""
    out = folder / name
    if db.resolve() != out.resolve():
        source, copy = sqlite3.connect(db), sqlite3.connect(out)
        with source, copy:
            source.backup(copy)
        source.close()
        copy.close()
    vacuum = sqlite3.connect(out)
    vacuum.execute("VACUUM")
    vacuum.close()
    return out


def write_result(
    folder: Path,
    title: str,
    command: str,
    printed: str = "",
    *,
    data: Any = None,
    study_db: Path | None = None,
    tails: Sequence[Path] = (),
    files: Sequence[Path] = (),
    commit: str | None = None,
    on: str | None = None,
    when: datetime | None = None,
) -> Path:
    """Write the result folder ``folder``: README.md (the header, then ``printed`` as a block),
    ``summary.json`` (``data``) where given, ``study.db`` from ``study_db``, and ``files.md``
    where there are ``tails`` (a section of each log's last lines) or ``files`` (a section of
    each whole, the file then removed: its section is its copy). A name is its path below
    ``folder`` (``K/run.tail.txt``), else its own. Returns the README. A README already there
    is replaced: a run into the same folder is a new result, and the finding written below the
    header is written again for it."""
    folder.mkdir(parents=True, exist_ok=True)
    readme = folder / "README.md"
    top = header(
        title,
        command,
        commit=commit or git_commit(),
        machine=on or machine(),
        when=when,
    )
    body = ""
    if printed:
        body += f"\nWhat it printed:\n\n```\n{printed.rstrip()}\n```\n"
    if data is not None:
        (folder / "summary.json").write_text(json.dumps(data, indent=1) + "\n")
        body += "\nThe figures as data: [summary.json](summary.json).\n"
    if study_db is not None:
        keep_study(study_db, folder)
        body += "\nThe study: `study.db` (`optuna-dashboard sqlite:///study.db`).\n"
    sections = [(_named(log.with_name(tail_name(log)), folder), tail(log)) for log in tails]
    sections += [(_named(f, folder), f.read_bytes().decode(errors="replace")) for f in files]
    if sections:
        (folder / FILES).write_text(files_page(f"{title}: its files", sections))
        for f in files:
            f.unlink()
        listed = ", ".join(f"[{n}]({FILES}#{anchor(n)})" for n, _ in sections)
        body += f"\nIts files ([{FILES}]({FILES})): {listed}.\n"
    readme.write_text(top + body)
    return readme


def _named(path: Path, folder: Path) -> str:
    """``path`` as a section's name: below ``folder`` where it is there, else its own name."""
    try:
        return path.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return path.name


class Printed(contextlib.AbstractContextManager["Printed"]):
    """Within ``with``, what is printed goes to the terminal and is kept for the result."""

    def __init__(self) -> None:
        self._kept = io.StringIO()
        self._stdout: TextIO = sys.stdout

    def __enter__(self) -> Printed:
        self._stdout = sys.stdout
        sys.stdout = _Tee(self._stdout, self._kept)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.stdout = self._stdout

    def text(self) -> str:
        return self._kept.getvalue()


class _Tee(io.TextIOBase):
    def __init__(self, *streams: TextIO) -> None:
        self._streams = streams

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the result's folder (made where missing)")
    parser.add_argument("--title", required=True)
    parser.add_argument("--command", required=True, help="the command that reruns the result")
    parser.add_argument("--summary", type=Path, help="a file of what the run printed")
    parser.add_argument("--db", type=Path, help="the study's SQLite database")
    parser.add_argument("--tail", type=Path, nargs="*", default=[], help="raw logs to tail")
    parser.add_argument(
        "--file",
        type=Path,
        nargs="*",
        default=[],
        help="small files kept whole as sections of files.md (and removed from the folder)",
    )
    parser.add_argument("--commit", help="tuner's commit (default: git's, of this checkout)")
    parser.add_argument("--machine", help="the machine (default: nvidia-smi's GPUs, or the CPU)")
    args = parser.parse_args(argv)
    printed = args.summary.read_text() if args.summary else ""
    readme = write_result(
        args.folder,
        args.title,
        args.command,
        printed,
        study_db=args.db,
        tails=[log for log in args.tail if log.is_file()],
        files=[f for f in args.file if f.is_file()],
        commit=args.commit,
        on=args.machine,
    )
    print(readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
