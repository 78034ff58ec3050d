"""The configuration a team serves today, as ``vllm serve --config`` reads it, made the baseline
of a new study (``tuner init --current FILE``).

The file's engine arguments become the spec's ``baseline``: trial 0, the arm every searched
configuration is confirmed against, called "your configuration" in the verdict. vLLM's
defaults are measured beside it as a candidate (``{}``) and measured again as often
(``confirm_candidates``), so that the verdict answers both questions: is the search's finalist
better than what you serve, and is what you serve better than vLLM's defaults. Its ``model``,
where it names one, is the study's model. Arguments of the server process rather than the
engine (its address, its name for the model, TLS) are left out: tuner starts each trial's
server on a port of its own and sends it unauthenticated requests. A credential
(``tuner.flags.SECRET_ARGUMENTS``: a Hugging Face token, an API key) is never copied: it stays
in your file, and is in no line tuner prints and no file of the study.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import SpecError
from tuner.flags import SECRET_ARGUMENTS, SERVER_ONLY, flag_name
from tuner.study.plan.spec_file import read_spec_document

# Arguments of ``vllm serve`` that a trial's server cannot take from your configuration.
SERVER_ARGUMENTS = SERVER_ONLY | frozenset(
    {
        "served-model-name", "ssl-keyfile", "ssl-certfile", "ssl-ca-certs",
        "root-path", "uds", "allowed-origins",
    }
)  # fmt: skip
MODEL = "model"


@dataclass(frozen=True)
class Current:
    """Your configuration: its model (None where the file names none), its engine arguments by
    their dashed names, the server arguments left out, and the names of the credentials left
    in the file (their values are not kept)."""

    model: str | None
    engine_args: Mapping[str, Any]
    left_out: tuple[str, ...]
    secrets: tuple[str, ...] = ()

    def spec_keys(self) -> dict[str, Any]:
        """What it sets in a new spec: the baseline, vLLM's defaults as a candidate, and both
        measured as often as the finalist."""
        return {
            "baseline": dict(self.engine_args),
            "candidates": [{}],
            "confirm_candidates": True,
        }


def read_current(path: Path) -> Current:
    """The configuration in ``path``; a ``SpecError`` naming the file where it is not a mapping
    of engine arguments."""
    document = read_spec_document(path, quote=False)
    where = str(path)
    if not isinstance(document, dict) or not document:
        raise SpecError(
            where, "<file>", "must be a mapping of vllm serve arguments, as --config reads"
        )
    model: str | None = None
    args: dict[str, Any] = {}
    left_out: list[str] = []
    secrets: list[str] = []
    for key, value in document.items():
        if not isinstance(key, str) or not key.strip():
            raise SpecError(where, str(key), "an argument's name must be text")
        name = flag_name(key)
        if name.partition(".")[0] in SECRET_ARGUMENTS:
            secrets.append(name)
        elif name == MODEL:
            if not isinstance(value, str) or not value:
                raise SpecError(where, key, "must be a model name or folder")
            model = value
        elif name in SERVER_ARGUMENTS:
            left_out.append(name)
        elif isinstance(value, dict):
            # A nested configuration (compilation-config: {...}): its fields as vLLM's command
            # line names them, one by one.
            for field, inner in value.items():
                args[_unique(args, flag_name(f"{name}.{field}"), where)] = inner
        else:
            args[_unique(args, name, where)] = value
    return Current(model, args, tuple(left_out), tuple(secrets))


def _unique(args: Mapping[str, Any], name: str, where: str) -> str:
    if name in args:
        raise SpecError(where, name, "given twice")
    return name
