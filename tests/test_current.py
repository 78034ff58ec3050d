"""Your configuration in the comparison: ``tuner init --current FILE`` takes the YAML you serve
with (``vllm serve --config FILE``) as the study's baseline, with vLLM's defaults measured beside
it, and the verdict names each ("your configuration", "vLLM's defaults").

The file is read as vLLM reads it (dashes or underscores, nested configurations); the server's
own arguments are left out, its credentials (a Hugging Face token, an API key) are copied
nowhere, and a file that is not a mapping of arguments is bad input. The naming is checked on
scripted studies; the last test measures both on vLLM's CPU build.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import run_tuner, write_small_trace, write_spec
from test_confirm import Scripted, header_of, run_scripted

from tuner.cli.exits import EXIT_BAD_INPUT
from tuner.cli.main import main
from tuner.errors import SpecError
from tuner.flags import SECRET_ARGUMENTS
from tuner.study.plan.current import read_current
from tuner.study.plan.spec import parse_spec
from tuner.study.store.record import ARGS_ATTR, TrialRecord

SERVED = """\
model: models/mine
max_num_seqs: 4
max-num-batched-tokens: 512
port: 8000
served-model-name: prod
api-key: s3cret
hf-token: hf_hunter2token
compilation-config:
  max_cudagraph_capture_size: 64
"""


def test_the_file_is_read_as_vllm_serve_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(SERVED)
    current = read_current(path)
    assert current.model == "models/mine"
    assert dict(current.engine_args) == {
        "max-num-seqs": 4,
        "max-num-batched-tokens": 512,
        "compilation-config.max_cudagraph_capture_size": 64,
    }
    assert current.left_out == ("port", "served-model-name")
    assert current.secrets == ("api-key", "hf-token")
    keys = current.spec_keys()
    assert keys["candidates"] == [{}] and keys["confirm_candidates"] is True


# A name of vLLM's arguments that reads as a credential's: a token, a key, a secret, a password
# (not allow-credentials, a CORS switch).
CREDENTIAL = re.compile(r"(^|_)(token|key|secret|password|passwd)$")


def test_every_credential_vllm_serve_takes_is_a_secret_argument() -> None:
    """The names of ``vllm serve``'s arguments (its engine's and its server's fields, read from
    the installed vLLM's source, not imported) that name a credential are each in
    ``SECRET_ARGUMENTS``, the one list of them."""
    found = importlib.util.find_spec("vllm")
    if found is None or found.origin is None:
        pytest.skip("vLLM is not installed here")
    root = Path(found.origin).parent
    sources = [root / "engine" / "arg_utils.py", *root.glob("entrypoints/**/cli_args.py")]
    fields = {
        name
        for source in sources
        if source.exists()
        for name in re.findall(r"^    ([a-z_]+): ", source.read_text(), re.MULTILINE)
    }
    assert {"hf_token", "api_key"} <= fields, sources
    credentials = {name.replace("_", "-") for name in fields if CREDENTIAL.search(name)}
    assert credentials <= SECRET_ARGUMENTS == {"hf-token", "api-key"}


@pytest.mark.parametrize(
    "text, said",
    [
        ("- max-num-seqs: 4\n", "must be a mapping"),
        ("{}\n", "must be a mapping"),
        ("max_num_seqs: 4\nmax-num-seqs: 8\n", "given twice"),
        ("model: 3\n", "must be a model name"),
        ("model: m\nhf-token: hf_hunter2tok: x\n", "not allowed here at line 2, column 24"),
    ],
)
def test_a_file_that_is_not_a_configuration_is_refused(tmp_path: Path, text: str, said: str):
    """Refused naming what is wrong, and never quoting a line (it may hold a credential)."""
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=said) as raised:
        read_current(path)
    assert "hunter2" not in str(raised.value)


def test_vllms_defaults_are_a_candidate_only_beside_a_baseline_of_the_specs_own(cpu_model):
    base = {"model": str(cpu_model), "dummy_model": None, "slos": {"ttft_p95_s": 1.0}}
    base["weights"] = {"ttft_p95_s": 1.0}
    spec = parse_spec(base | {"baseline": {"max-num-seqs": 4}, "candidates": [{}]})
    assert spec.names_baseline and spec.defaults_candidate == 0
    with pytest.raises(SpecError, match="vLLM's defaults, the baseline already"):
        parse_spec(base | {"candidates": [{}]})
    with pytest.raises(SpecError, match="vLLM's defaults twice"):
        parse_spec(base | {"baseline": {"max-num-seqs": 4}, "candidates": [{}, {}]})
    assert not parse_spec(base).names_baseline


def test_init_makes_your_configuration_the_baseline(tmp_path: Path, cpu_model: Path) -> None:
    trace = write_small_trace(tmp_path / "small.csv")
    served = tmp_path / "serve.yaml"
    served.write_text(SERVED.replace("models/mine", str(cpu_model)))
    done = run_tuner("init", "--trace", trace, "--current", served, cwd=tmp_path, timeout_s=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "baseline: your configuration from" in done.stdout
    assert "left out of it: port, served-model-name" in done.stdout
    assert f"left in {served}: api-key, hf-token (a credential" in done.stdout
    for secret in ("s3cret", "hf_hunter2token"):
        assert secret not in done.stdout + done.stderr
        written = [p for p in tmp_path.rglob("*") if p.is_file() and p != served]
        assert written and not [p for p in written if secret.encode() in p.read_bytes()]
    spec = yaml.safe_load((tmp_path / "studies" / "small.yaml").read_text())
    assert spec["model"] == str(cpu_model) and spec["dummy_model"] is None
    assert spec["baseline"] == {
        "max-num-seqs": 4,
        "max-num-batched-tokens": 512,
        "compilation-config.max_cudagraph_capture_size": 64,
    }
    assert spec["candidates"] == [{}] and spec["confirm_candidates"] is True

    other = run_tuner(
        "init", "--trace", trace, "--study", "other", "--current", served, "--model", "elsewhere",
        cwd=tmp_path, timeout_s=300,
    )  # fmt: skip
    assert other.returncode == EXIT_BAD_INPUT, other.stdout + other.stderr
    assert "differs from the model" in other.stderr
    assert not (tmp_path / "studies" / "other.yaml").exists()


def test_the_verdict_names_your_configuration_and_vllms_defaults(tmp_path, cpu_model, capsys):
    # Your configuration (max-num-seqs 2) is trial 0, vLLM's defaults (the {} candidate) trial 1,
    # the finalist max-num-seqs 8 (the other candidate); it beats your configuration on 3 fresh
    # engines each, and vLLM's defaults, measured again as often, are slower in every pair.
    scores = {2: [0.9, 0.95, 0.92, 0.97], None: [0.8, 0.85, 0.82, 0.84], 8: [0.4, 0.42, 0.41, 0.43]}
    scripted = Scripted(scores)
    _, _, args = run_scripted(
        tmp_path, cpu_model, scripted, 1, 3, candidates=True,
        spec_candidates=[{}, {"max-num-seqs": 8}], baseline={"max-num-seqs": 2},
    )  # fmt: skip
    assert scripted.order[:3] == [2, None, 8]
    assert main(args) == 0
    header = header_of(tmp_path)
    assert "beats your configuration on fresh engines" in header
    assert "# baseline trial 0: score median" in header
    assert "# vLLM's defaults trial 1: score median 0.84 of 3" in header
    assert "# beats vLLM's defaults trial 1 beyond" in header
    assert "vLLM's defaults kept" not in header


@pytest.mark.vllm
def test_your_configuration_is_measured_beside_vllms_defaults_on_the_cpu_build(
    tiny_model: Path, tmp_path: Path
) -> None:
    # As a user runs it: the YAML served today, tuner init --current, tuner run. Two trials,
    # your configuration (max-num-seqs 2) and vLLM's defaults, each a real engine; no searched
    # trial and no confirmation (the cheap settings of test_your_model), so what is written is
    # your configuration, kept, beside what vLLM's defaults measured.
    work = tmp_path / "work"
    work.mkdir()
    trace = write_small_trace(work / "small.csv")
    model = os.path.relpath(tiny_model, work)
    served = write_spec(work / "serve.yaml", {"model": model, "max-num-seqs": 2, "port": 8000})
    slos = ["--slo", "ttft_p95_s=30", "--slo", "tpot_p95_s=2"]
    done = run_tuner("init", "--trace", trace, "--current", served, *slos, cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    spec_path = work / "studies" / "small.yaml"
    spec = yaml.safe_load(spec_path.read_text())
    cheap = {"window_s": 2, "prune_factor": 0, "client_tolerance_s": 60.0, "confirm_top_k": 0}
    write_spec(spec_path, spec | cheap | {"engine_args": {"enforce-eager": True}})

    done = run_tuner("run", "--trace", trace, "--n-trials", "2", cwd=work)

    assert done.returncode in (0, 3, 4), done.stdout + done.stderr
    storage = f"sqlite:///{work / 'studies' / 'small.db'}"
    trials = optuna.load_study(study_name="small", storage=storage).get_trials()
    args = [t.user_attrs[ARGS_ATTR] for t in trials]
    assert args[0]["max-num-seqs"] == 2 and "max-num-seqs" not in args[1]
    assert "port" not in args[0]
    records = [TrialRecord.of(t) for t in trials]
    assert records[0].spec_baseline and records[1].defaults_candidate
    header = (work / "configs" / "small.yaml").read_text()
    if done.returncode == 4:  # your configuration kept, vLLM's defaults the closest
        assert "# your configuration kept:" in header
        assert "# closest searched trial 1 (vLLM's defaults):" in header
        assert "left to vLLM: max-num-seqs (the baseline's 2)" in header
        assert "max-num-seqs: 2" in header.split("# Serve with")[1]
    if done.returncode == 0:  # vLLM's defaults met the SLOs where your configuration did not
        assert "where your configuration misses them" in header
