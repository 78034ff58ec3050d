"""The model folders tuner writes: the same bytes each time, a complete one reused, one cut short
or of an older writer written again, another model never written over.

Real files, real torch and transformers (the cpu-tiny shape is written in a few seconds).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import REPO

from tuner.engine.dummy_model import (
    MANIFEST,
    SHAPES,
    STAGING_PREFIX,
    has_weights,
    is_complete,
    model_config,
    write_model,
)
from tuner.errors import InputError
from tuner.study.plan.spec import load_spec, parse_spec
from tuner.study.setup.prepare import write_dummy_model


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cpu-tiny with its weights, written once for the module: the reference bytes."""
    return write_model(tmp_path_factory.mktemp("reference") / "cpu-tiny", "cpu-tiny")


def test_a_folder_is_the_same_bytes_each_time_and_reused_once_complete(
    written: Path, tmp_path: Path
) -> None:
    assert sorted(contents(written)) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        MANIFEST,
    ]
    again = write_model(tmp_path / "cpu-tiny", "cpu-tiny")
    assert contents(again) == contents(written)
    assert is_complete(again, "cpu-tiny") and has_weights(again)

    weights = again / "model.safetensors"
    before = weights.stat()
    write_model(again, "cpu-tiny")
    after = weights.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # Another seed draws other weights.
    assert not is_complete(again, "cpu-tiny", seed=1)
    other = write_model(tmp_path / "seed-1", "cpu-tiny", seed=1)
    assert (other / "model.safetensors").read_bytes() != weights.read_bytes()


@pytest.mark.parametrize("cut", ["truncated weights", "left mid-write", "another shape"])
def test_a_folder_tuner_wrote_is_not_trusted_unless_complete(
    written: Path, tmp_path: Path, cut: str
) -> None:
    folder = tmp_path / "cpu-tiny"
    if cut == "truncated weights":
        write_model(folder, "cpu-tiny")
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif cut == "left mid-write":
        write_model(folder, "cpu-tiny")
        (folder / MANIFEST).write_text('{"format": 1, "writing": true}')
        (folder / "tokenizer.json").write_text("{")
        (folder / f"{STAGING_PREFIX}abc").mkdir()
        (folder / f"{STAGING_PREFIX}abc" / "model.safetensors").write_bytes(b"half")
    else:
        write_model(folder, "cpu-demo")
    assert not is_complete(folder, "cpu-tiny")

    write_model(folder, "cpu-tiny")

    assert contents(folder) == contents(written)


def test_an_older_writers_folder_without_weights_gets_them(tmp_path: Path, written: Path) -> None:
    """A folder as tuner wrote it before it saved weights: the config of the shape, no
    weights, no manifest; its word-level tokenizer is replaced too."""
    folder = tmp_path / "cpu-tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(model_config(SHAPES["cpu-tiny"])))
    (folder / "tokenizer.json").write_text('{"model": {"type": "WordLevel"}}')
    (folder / "notes.txt").write_text("mine")

    write_model(folder, "cpu-tiny")

    assert contents(folder) == {**contents(written), "notes.txt": b"mine"}


def test_without_weights_a_folder_serves_only_random_ones(tmp_path: Path, written: Path) -> None:
    folder = write_model(tmp_path / "cpu-tiny", "cpu-tiny", weights=False)
    assert not has_weights(folder)
    assert is_complete(folder, "cpu-tiny", weights=False)
    assert not is_complete(folder, "cpu-tiny")
    # A folder with weights does for a study on random weights too.
    assert is_complete(written, "cpu-tiny", weights=False)

    write_model(folder, "cpu-tiny")

    assert contents(folder) == contents(written)


@pytest.mark.parametrize(
    ("model", "said"),
    [("weights", "weights that tuner did not write"), ("config", "a model of another shape")],
)
def test_a_model_tuner_did_not_write_is_never_written_over(
    written: Path, tmp_path: Path, model: str, said: str
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    if model == "weights":
        for name in ("config.json", "model.safetensors"):
            (folder / name).write_bytes((written / name).read_bytes())
    else:
        (folder / "config.json").write_text(json.dumps(model_config(SHAPES["cpu-demo"])))
    before = contents(folder)

    with pytest.raises(FileExistsError, match=said):
        write_model(folder, "cpu-tiny")

    assert contents(folder) == before


def test_the_tokenizer_encodes_text_one_token_a_byte_and_decodes_it(written: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(written)
    ids = tokenizer("Hello, wörld")["input_ids"]
    assert len(ids) == len("Hello, wörld".encode()) and all(1 <= i <= 256 for i in ids)
    assert tokenizer.decode(ids) == "Hello, wörld"
    assert tokenizer.eos_token_id == 0


def test_the_demo_writes_its_model_with_weights_unless_it_measures_random_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tuner run``'s step: the demo spec's model, at its relative path, once."""
    monkeypatch.chdir(tmp_path)
    demo = load_spec(REPO / "studies" / "demo.yaml")

    assert write_dummy_model(demo) is True
    assert is_complete(demo.model, "cpu-tiny") and has_weights(demo.model)
    assert write_dummy_model(demo) is False

    random = dataclasses.replace(
        demo, model="models/other", engine_args={**demo.engine_args, "load-format": "dummy"}
    )
    assert write_dummy_model(random) is True
    assert is_complete(random.model, "cpu-tiny", weights=False)
    assert not has_weights(random.model)

    # Someone else's model at that path: refused, and left as it is.
    theirs = dataclasses.replace(demo, model="models/theirs")
    Path(theirs.model).mkdir(parents=True)
    Path(theirs.model, "config.json").write_text(json.dumps(model_config(SHAPES["cpu-demo"])))
    with pytest.raises(InputError, match="models/theirs holds a model of another shape"):
        write_dummy_model(theirs)
    assert sorted(p.name for p in Path(theirs.model).iterdir()) == ["config.json"]


@pytest.mark.parametrize(
    ("model", "said"),
    [
        ("../outside", "a stand-in model is written only in a folder below"),
        (".", "a stand-in model is written only in a folder below"),
        ("notes", "notes holds files that tuner did not write"),
        ("notes/todo.txt", "is a file, not a folder"),
    ],
)
def test_a_stand_in_is_written_only_below_the_working_folder_and_never_over_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str, said: str
) -> None:
    """A path out of the working folder, the folder itself, a folder of someone's files or a
    file: refused before anything is written."""
    working = tmp_path / "work"
    (working / "notes").mkdir(parents=True)
    (working / "notes" / "todo.txt").write_text("mine")
    monkeypatch.chdir(working)
    spec = dataclasses.replace(load_spec(REPO / "studies" / "demo.yaml"), model=model)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(InputError, match=said):
        write_dummy_model(spec)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_a_spec_without_a_dummy_model_names_no_stand_in(tmp_path: Path) -> None:
    """A spec that gives only its model is measured on that model: nothing is written."""
    spec = parse_spec({"model": "Qwen/Qwen2.5-7B-Instruct"}, "s.yaml")
    assert spec.dummy_model is None
    assert write_dummy_model(spec, tmp_path) is False
    assert list(tmp_path.iterdir()) == []
