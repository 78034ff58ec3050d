"""The user's own model: a local folder with saved weights, or a Hugging Face id from the cache.

The model is ``cpu-tiny`` with its weights saved for real (``tiny_model``), served by vLLM's
default load path, and the same files laid out as huggingface_hub's offline cache
(``hub_cache``). Each ``tuner run`` measures one trial (vLLM's defaults) on two seconds of a
small trace; where the emitted configuration matters it is then served by vLLM itself from
another folder, as a user would, and asked for one completion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from conftest import (
    HUB_MODEL_ID,
    one_completion,
    run_tuner,
    served,
    write_small_trace,
    write_spec,
)

from tuner.engine.dummy_model import SHAPES, write_model
from tuner.study.store.record import ARGS_ATTR
from tuner.traces.workload import ModelInfo, _plain_config, model_info

# Lenient SLOs: the point is that a configuration is written (exit 0 or 3), not that two shared
# CPU cores meet them.
SLO_ARGS = ["--slo", "ttft_p95_s=30", "--slo", "tpot_p95_s=2", "--objective", "latency"]
# What the command line cannot set and a cheap run needs: no re-measurement of the winner, two
# seconds of the trace, no pruning, and a client that may fall behind on two busy cores.
CHEAP = {"confirm_top_k": 0, "window_s": 2, "prune_factor": 0, "client_tolerance_s": 60.0}


def cheap_spec(model: str) -> dict[str, Any]:
    """A spec for the user's ``model`` (real weights) that runs cheaply.

    With ``enforce-eager``, the user's choice, so measured and emitted: without it every start
    compiles the model anew (vLLM's compile cache is keyed on the model's path, a fresh folder
    each session), 2.5 minutes of a 4 to 6 minute start on two busy cores (measured 2026-11-26).
    """
    return {"model": model, "dummy_model": None, "engine_args": {"enforce-eager": True}, **CHEAP}


def tuner_run(
    trace: Path, model: str, cwd: Path, env: dict[str, str] | None = None, *extra: str
) -> subprocess.CompletedProcess[str]:
    result = run_tuner(
        "run", "--trace", trace, "--model", model, "--n-trials", "1", *SLO_ARGS, *extra,
        cwd=cwd, env=env,
    )  # fmt: skip
    # A configuration written: vLLM's defaults kept (4: one trial, nothing else measured), or the
    # closest, where a slow machine missed the SLOs (3).
    assert result.returncode in (0, 3, 4), result.stdout + result.stderr
    return result


def config_of(text: str) -> dict[str, Any]:
    document = yaml.safe_load(text)
    assert isinstance(document, dict)
    return document


@pytest.mark.vllm
def test_local_folder_with_saved_weights_tunes_and_serves_from_anywhere(
    tiny_model: Path, tmp_path: Path
) -> None:
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    trace = write_small_trace(work / "small.csv")
    # As a user names a folder: relative to where tuner runs.
    model = os.path.relpath(tiny_model, work)
    write_spec(work / "spec.yaml", cheap_spec(model))

    result = tuner_run(trace, model, work, None, "--spec", "spec.yaml")

    engine = yaml.safe_load((work / "runs" / "small" / "trial-0000" / "engine.yaml").read_text())
    assert "load-format" not in engine and "load_format" not in engine
    text = (work / "configs" / "small.yaml").read_text()
    assert "random weights" not in text and "random weights" not in result.stdout
    config = config_of(text)
    assert config["model"] == str(tiny_model.resolve())
    assert config["enforce-eager"] is True
    assert "load-format" not in config and "load_format" not in config
    with served(work / "configs" / "small.yaml", elsewhere) as url:
        one_completion(url, str(tiny_model.resolve()))


@pytest.mark.vllm
def test_hub_id_from_the_offline_cache_measured_on_random_weights_serves_its_weights(
    hub_cache: dict[str, str], tmp_path: Path
) -> None:
    """A Hugging Face id from the offline cache, measured with ``--dummy-weights``: the trials
    load random weights, the YAML written names the id without ``load-format`` and serves the
    cached weights, as vLLM loads them."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    (work / "studies").mkdir(parents=True)
    elsewhere.mkdir()
    trace = write_small_trace(tmp_path / "small.csv")
    write_spec(work / "studies" / "small.yaml", cheap_spec(HUB_MODEL_ID))

    result = tuner_run(trace, HUB_MODEL_ID, work, hub_cache, "--dummy-weights")

    assert sorted(p.name for p in work.iterdir()) == ["configs", "runs", "studies"]
    assert "measuring on random weights" in result.stdout
    engine = yaml.safe_load((work / "runs" / "small" / "trial-0000" / "engine.yaml").read_text())
    assert engine["load-format"] == "dummy"
    study = optuna.load_study(study_name="small", storage=f"sqlite:///{work}/studies/small.db")
    assert study.trials[0].user_attrs[ARGS_ATTR]["load-format"] == "dummy"
    text = (work / "configs" / "small.yaml").read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    assert "Measured on random weights (load-format: dummy)" in header
    config = config_of(text)
    assert config["model"] == HUB_MODEL_ID
    assert "load-format" not in config and "load_format" not in config
    with served(work / "configs" / "small.yaml", elsewhere, hub_cache) as url:
        one_completion(url, HUB_MODEL_ID)


def test_huggingface_hub_resolves_the_cache_as_laid_out(
    hub_cache: dict[str, str], tiny_model: Path, tmp_path: Path
) -> None:
    """The cache the vLLM tests serve from is one huggingface_hub itself reads, offline."""
    code = (
        "import sys\n"
        "from huggingface_hub import snapshot_download\n"
        "print(snapshot_download(sys.argv[1], local_files_only=True))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", code, HUB_MODEL_ID],
        env={**os.environ, **hub_cache},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    snapshot = Path(found.stdout.strip())
    hub = Path(hub_cache["HF_HOME"], "hub", "models--tuner-tests--cpu-tiny")
    commit = (hub / "refs" / "main").read_text()
    assert snapshot == hub / "snapshots" / commit
    for path in tiny_model.iterdir():
        assert (snapshot / path.name).is_symlink()
        assert (snapshot / path.name).read_bytes() == path.read_bytes()


def test_init_writes_the_spec_for_a_hub_id_and_starts_nothing(
    hub_cache: dict[str, str], tmp_path: Path
) -> None:
    trace = write_small_trace(tmp_path / "small.csv")
    args = ["init", "--trace", trace, "--model", HUB_MODEL_ID]
    args += ["--slo", "ttft_p95_s=0.3", "--slo", "tpot_p95_s=0.03", "--objective", "capacity"]

    first = run_tuner(*args, cwd=tmp_path, env=hub_cache, timeout_s=300)

    assert first.returncode == 0, first.stdout + first.stderr
    spec = yaml.safe_load((tmp_path / "studies" / "small.yaml").read_text())
    assert spec["model"] == HUB_MODEL_ID and spec["dummy_model"] is None
    assert spec["slos"] == {"ttft_p95_s": 0.3, "tpot_p95_s": 0.03}
    assert spec["objective_mode"] == "capacity"
    assert "load-format" not in spec["engine_args"]
    # Nothing measured: no storage, no trial folder, no configuration.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.csv", "studies"]
    assert [p.name for p in (tmp_path / "studies").iterdir()] == ["small.yaml"]

    again = run_tuner(*args, cwd=tmp_path, env=hub_cache, timeout_s=300)

    assert again.returncode == 2, again.stdout + again.stderr
    assert "exists" in again.stderr
    assert yaml.safe_load((tmp_path / "studies" / "small.yaml").read_text()) == spec


def test_an_id_missing_from_the_offline_cache_is_bad_input(
    hub_cache: dict[str, str], tmp_path: Path
) -> None:
    """``tuner run`` and ``tuner init`` say so in one line and write nothing (a spec written
    with that id would stand in the way of the next run)."""
    trace = write_small_trace(tmp_path / "small.csv")
    model = ["--model", "tuner-tests/absent"]

    for args in (
        ["run", "--trace", trace, *model, "--n-trials", "1"],
        ["init", "--trace", trace, *model],
    ):
        result = run_tuner(*args, cwd=tmp_path, env=hub_cache, timeout_s=300)

        assert result.returncode == 2, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert "tuner-tests/absent" in lines[0]
        assert [p.name for p in tmp_path.iterdir()] == ["small.csv"]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_plain_config_reads_as_transformers_reads_it(tmp_path: Path, shape: str) -> None:
    """A folder's ``config.json`` read as JSON gives what transformers reads from it."""
    from transformers import AutoConfig

    folder = write_model(tmp_path / shape, shape, weights=False)
    text = AutoConfig.from_pretrained(folder).get_text_config()
    assert model_info(str(folder), None) == ModelInfo(text.vocab_size, text.max_position_embeddings)
    assert model_info(str(folder), 2048).max_model_len == 2048


def test_a_config_json_with_code_of_its_own_or_no_figures_is_read_by_transformers(
    tmp_path: Path,
) -> None:
    folder = write_model(tmp_path / "m", "cpu-tiny", weights=False)
    config = json.loads((folder / "config.json").read_text())
    assert _plain_config(folder, None) is not None
    for changed in (
        {**config, "auto_map": {"AutoConfig": "mine.Config"}},
        {k: v for k, v in config.items() if k != "max_position_embeddings"},
        {**config, "vocab_size": True},
        {**config, "text_config": "none"},
    ):
        (folder / "config.json").write_text(json.dumps(changed))
        assert _plain_config(folder, None) is None
    (folder / "config.json").write_text(json.dumps({**config, "text_config": {**config}}))
    assert _plain_config(folder, None) == model_info(str(folder), None)
    assert _plain_config(tmp_path / "nowhere", None) is None
