"""Flag names and the emitted config: byte for byte what the trial's server was started with."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from tuner.engine.dummy_model import write_model
from tuner.engine.environment import command_to_serve
from tuner.engine.launchers import ProcessLauncher
from tuner.engine.process import Engine
from tuner.flags import config_yaml, flag_name, normalize
from tuner.study.measure.scoring import Criteria, Verdict, score, verdict
from tuner.study.result.emit import Provenance, render, served_config

PROVENANCE = Provenance(
    tuner_version="0.1.0",
    vllm_version="0.32.0",
    device="CPU test, 2 cores",
    study="s",
    trace_path="traces/t.csv",
    trace_sha256="ab" * 32,
    window="10 requests",
    trial_number=3,
)

MET = Verdict(meets_slos=True)

# A trial's arguments as the study builds them: fixed ones first, then the searched ones.
ARGS = {
    "max-model-len": 4096,
    "enforce-eager": True,
    "max-num-seqs": 12,
    "gpu-memory-utilization": 0.15,
    "served-model-name": "demo",
}


@pytest.mark.parametrize(
    ("raw", "dashed"),
    [
        ("max_num_seqs", "max-num-seqs"),
        ("--max-num-seqs", "max-num-seqs"),
        (" gpu_memory_utilization ", "gpu-memory-utilization"),
        ("model", "model"),
    ],
)
def test_flag_name(raw, dashed):
    assert flag_name(raw) == dashed


def test_normalize_rejects_the_same_argument_twice():
    assert normalize({"max_num_seqs": 1, "block-size": 16}) == {"max-num-seqs": 1, "block-size": 16}
    with pytest.raises(ValueError, match="max-num-seqs"):
        normalize({"max_num_seqs": 1, "max-num-seqs": 2})


def test_config_yaml_keeps_order_and_types():
    text = config_yaml({"model": "m", "max_num_seqs": 8, "enforce_eager": True, "kv": 0.15})
    assert text == "model: m\nmax-num-seqs: 8\nenforce-eager: true\nkv: 0.15\n"
    assert yaml.safe_load(text) == {
        "model": "m",
        "max-num-seqs": 8,
        "enforce-eager": True,
        "kv": 0.15,
    }


def without_server_lines(text: str) -> str:
    return "".join(
        line for line in text.splitlines(keepends=True) if not line.startswith(("host:", "port:"))
    )


def test_emitted_body_is_the_trial_config_less_host_and_port(tmp_path):
    # The trial's engine.yaml, written by the real engine code; the process it launches is a
    # stand-in module that exits at once (vLLM is not needed to write the file).
    engine = Engine("org/model", ARGS, tmp_path, launcher=ProcessLauncher(module="this"))
    port = engine.start().base_url.rsplit(":", 1)[1]
    engine.stop()
    measured = engine.config_path.read_text()
    assert "host: 127.0.0.1\n" in measured and f"port: {port}\n" in measured

    text = render("org/model", ARGS, PROVENANCE, MET, {"ttft_p95_s": 0.25}, None)
    header, _, body = text.partition(f"# Serve with: {command_to_serve('<this file>')}\n")
    assert body == served_config("org/model", ARGS)
    assert body.encode() == without_server_lines(measured).encode()
    assert all(line.startswith("#") for line in header.splitlines())


def test_a_study_on_random_weights_emits_the_config_for_the_real_weights(tmp_path):
    dummy = {"load-format": "dummy", **ARGS}
    text = render("org/model", dummy, PROVENANCE, MET, {"ttft_p95_s": 0.25}, None)
    assert yaml.safe_load(text) == {"model": "org/model", **ARGS}
    assert "load-format" not in text.split("# Serve with")[1]
    assert "# Measured on random weights (load-format: dummy)" in text
    assert "# The config below loads the model's real weights." in text
    # Another load format is the user's choice, and kept.
    assert "load-format: safetensors" in served_config("m", {"load-format": "safetensors"})
    assert "random weights" not in render("m", ARGS, PROVENANCE, MET, {}, None)


def header_of(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))


def test_random_weights_of_a_folder_say_what_the_config_loads_from_it(tmp_path):
    """A folder with no weights: the file serves once they are put there; with weights (the
    user's, or random ones tuner saved), it loads those."""
    dummy = {"load-format": "dummy", **ARGS}
    folder = tmp_path / "models" / "mine"
    write_model(folder, "cpu-tiny", weights=False)

    empty = header_of(render(str(folder), dummy, PROVENANCE, MET, {}, None))

    assert "# Measured on random weights (load-format: dummy)" in empty
    assert f"# {folder} holds no weights: the config below serves\n" in empty
    assert "# once the model's real weights are in that folder.\n" in empty
    assert "loads" not in empty

    (folder / "model.safetensors").write_bytes(b"")
    saved = header_of(render(str(folder), dummy, PROVENANCE, MET, {}, None))

    assert "# The config below loads the weights saved in that folder.\n" in saved
    assert "holds no weights" not in saved and "real weights" not in saved
    # Measured on the weights in the folder: nothing said of random weights.
    assert "weights" not in header_of(render(str(folder), ARGS, PROVENANCE, MET, {}, None))


def test_a_local_model_folder_is_named_by_its_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "models" / "mine").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    body = yaml.safe_load(served_config("models/mine", ARGS))
    assert body["model"] == str(tmp_path / "models" / "mine")
    assert yaml.safe_load(served_config("Qwen/Qwen2.5-0.5B-Instruct", ARGS))["model"] == (
        "Qwen/Qwen2.5-0.5B-Instruct"
    )


def test_served_config_drops_host_and_port():
    body = served_config("m", {**ARGS, "host": "0.0.0.0", "port": 8000})
    assert "host" not in body and "port" not in body
    assert body.startswith("model: m\n")


def test_header_quotes_best_and_baseline():
    best = {"ttft_p95_s": 0.25, "throughput_req_per_s": 3.0}
    baseline = {"ttft_p95_s": 0.5}
    text = render("m", ARGS, PROVENANCE, MET, best, baseline)
    lines = text.splitlines()
    ttft = next(line for line in lines if "p95 TTFT" in line)
    assert ttft.split() == ["#", "p95", "TTFT", "best", "250.0", "ms", "defaults", "500.0", "ms"]
    kept = render("m", ARGS, PROVENANCE, MET, baseline, best, labels=("defaults", "trial 4"))
    ttft = next(line for line in kept.splitlines() if "p95 TTFT" in line)
    assert ttft.split()[3:] == ["defaults", "500.0", "ms", "trial", "4", "250.0", "ms"]
    assert "n/a" in next(line for line in lines if "p95 TPOT" in line)
    assert "# Study 's', trial 3." in lines
    assert f"# Trace: traces/t.csv (sha256 {'ab' * 32})" in lines
    # The whole file, header included, is a YAML mapping of just the served config.
    assert yaml.safe_load(text) == {"model": "m", **ARGS}


def test_header_without_baseline_has_no_baseline_column():
    text = render("m", ARGS, PROVENANCE, MET, {"ttft_p95_s": 0.25}, None)
    assert "baseline" not in text


def test_header_starts_with_the_verdict():
    met = render("m", ARGS, PROVENANCE, MET, {"ttft_p95_s": 0.25}, None)
    assert met.splitlines()[:2] == [
        "# meets SLOs: yes",
        "# Tuned by tuner 0.1.0 for vLLM 0.32.0 on CPU test, 2 cores.",
    ]
    assert "best" in next(line for line in met.splitlines() if "p95 TTFT" in line)


def test_header_of_a_configuration_that_misses_names_each_slo_missed():
    slos = {"ttft_p95_s": 2.0, "tpot_p95_s": 0.05, "e2e_p99_s": 30.0}
    measured = {"ttft_p95_s": 4.561, "tpot_p95_s": 0.0634, "e2e_p99_s": 12.0, "error_rate": 0.125}
    judged = score(measured, Criteria(slos, {"ttft_p95_s": 1.0}, 0.0))
    text = render("m", ARGS, PROVENANCE, verdict(judged.constraints, measured), measured, None)
    lines = text.splitlines()
    assert lines[:5] == [
        "# meets SLOs: no",
        "#   ttft_p95_s: 4561 ms (SLO 2000 ms)",
        "#   tpot_p95_s: 63.4 ms (SLO 50 ms)",
        "#   error_rate: 12.5% (SLO 0.0%)",
        "# Tuned by tuner 0.1.0 for vLLM 0.32.0 on CPU test, 2 cores.",
    ]
    assert "closest" in next(line for line in lines if "p95 TTFT" in line)
    # Still exactly the trial's engine arguments under the header.
    assert yaml.safe_load(text) == {"model": "m", **ARGS}
    assert text.endswith(served_config("m", ARGS))


def test_header_says_when_the_vllm_and_device_are_not_the_trials():
    recorded = render("m", ARGS, PROVENANCE, MET, {}, None).splitlines()
    assert not any("recorded no vLLM version" in line for line in recorded)
    writer = replace(PROVENANCE, machine_of_writer=True)
    lines = render("m", ARGS, writer, MET, {}, None).splitlines()
    assert lines[1:3] == [
        "# Tuned by tuner 0.1.0 for vLLM 0.32.0 on CPU test, 2 cores.",
        "# (trial 3 recorded no vLLM version or device: those are of the machine that wrote "
        "this file)",
    ]
