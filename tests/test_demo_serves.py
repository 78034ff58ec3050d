"""The Quick start's YAML serves as it is.

The demo's model written as ``tuner run`` writes it (``write_dummy_model`` on the parsed
``studies/demo.yaml``, from the folder tuner runs in), a searched trial's engine arguments built
as the study builds them, the file rendered as the demo's run emits it, then served by vLLM with
nothing added, from another folder, and asked for a completion. One engine start.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import yaml
from conftest import REPO, SHIPPED_TRACE, one_completion, served
from optuna.trial import FixedTrial, Trial

from tuner.study.measure.scoring import Verdict
from tuner.study.plan.spec import load_spec
from tuner.study.result.emit import Provenance, render
from tuner.study.setup.prepare import write_dummy_model
from tuner.study.trials.search import suggest

PROVENANCE = Provenance(
    tuner_version="0.1.0",
    vllm_version="0.32.0",
    device="CPU test",
    study="demo",
    trace_path=str(SHIPPED_TRACE.relative_to(REPO)),
    trace_sha256="0" * 64,
    window="112 requests",
    trial_number=2,
)


@pytest.mark.vllm
def test_the_demo_config_serves_a_completion_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(work)
    spec = load_spec(REPO / "studies" / "demo.yaml")
    assert write_dummy_model(spec)
    # A fixed trial answers as an asked one does (``suggest`` reads nothing else of it).
    trial = cast(Trial, FixedTrial({"max-num-seqs": 16, "max-num-batched-tokens": 4096}))
    args = {**spec.engine_args, **suggest(trial, spec.space, spec.engine_args)}
    measured = {"ttft_p95_s": 0.5, "tpot_p95_s": 0.02, "e2e_p99_s": 3.0}
    config = work / "configs" / "demo.yaml"
    config.parent.mkdir()
    config.write_text(render(spec.model, args, PROVENANCE, Verdict(True), measured, measured))

    text = config.read_text()
    model = str((work / spec.model).resolve())
    assert yaml.safe_load(text) == {"model": model, **args}
    assert "weights" not in "".join(line for line in text.splitlines() if line.startswith("#"))
    with served(config, elsewhere) as url:
        one_completion(url, model)
