"""The default search space sized to the hardware: on a GPU, max-num-seqs reaches vLLM's own
default for that GPU; on vLLM's CPU build it stays 1 to 32.

nvidia-smi is the GPU seam: the device comes from ``visible_gpus`` fed what
``nvidia-smi --query-gpu=index,uuid,memory.total,name --format=csv,noheader,nounits`` prints.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuner.engine.environment import visible_gpus
from tuner.engine.vllm_defaults import BatchDefaults
from tuner.flags import MAX_CAPTURE_SIZE
from tuner.study.plan.space import (
    GPU_CAPACITY_WARMUP_REQUESTS,
    capture_choices,
    default_spec_text,
    table_batch_defaults,
)
from tuner.study.plan.spec import Dimension, parse_spec

PROMPTS = list(range(10, 201))
DEMO = Path(__file__).parent.parent / "studies/demo.yaml"


def first_gpu(nvidia_smi: str):
    return next(iter(visible_gpus({}, lambda: nvidia_smi)), None)


def gpu_space(nvidia_smi: str) -> dict[str, Dimension]:
    text = default_spec_text("m", gpu=True, prompt_tokens=PROMPTS, device=first_gpu(nvidia_smi))
    return {d.name: d for d in parse_spec(yaml.safe_load(text)).space}


@pytest.mark.parametrize(
    ("nvidia_smi", "high"),
    [
        ("0, GPU-1, 81559, NVIDIA H100 80GB HBM3\n", 1024),
        ("0, GPU-1, 143771, NVIDIA H200\n", 1024),
        # Below 70 GiB, and A100s of any size, keep vLLM's smaller default.
        ("0, GPU-1, 49140, NVIDIA L40S\n", 256),
        ("0, GPU-1, 81920, NVIDIA A100-SXM4-80GB\n", 256),
        # vLLM reads its device 0: the first GPU listed decides.
        ("0, GPU-1, 23034, NVIDIA L4\n1, GPU-2, 81559, NVIDIA H100 80GB HBM3\n", 256),
    ],
)
def test_the_gpu_space_reaches_vllms_default_max_num_seqs_on_a_log_scale(nvidia_smi, high):
    seqs = gpu_space(nvidia_smi)["max-num-seqs"]
    assert (seqs.kind, seqs.low, seqs.high, seqs.log) == ("int", 1, high, True)
    # The capture range covers steps of up to that many decodes beside a prompt, and vLLM's own
    # range at that max-num-seqs is a level and the default, placed by its size.
    capture = gpu_space(nvidia_smi)[MAX_CAPTURE_SIZE]
    vllm_range = min(2 * high, 512)
    assert capture.choices == tuple(sorted({*capture_choices(PROMPTS, high, 1), vllm_range}))
    assert capture.default == vllm_range


@pytest.mark.parametrize("nvidia_smi", ["", "0, GPU-1, [N/A], NVIDIA GB10\n"])
def test_unknown_gpu_memory_falls_back_to_256(nvidia_smi):
    seqs = gpu_space(nvidia_smi)["max-num-seqs"]
    assert (seqs.high, seqs.log) == (256, True)


def test_the_spec_header_says_why_the_ceiling_is_vllms_default():
    device = first_gpu("0, GPU-1, 81559, NVIDIA H100 80GB HBM3\n")
    header = default_spec_text("m", gpu=True, device=device).split("\nmodel:")[0]
    assert "max-num-seqs: 1 to 1024, vLLM's own default on this GPU, log scale" in header
    assert "benchmarks/results/h100/" in header


def test_the_gpu_space_offers_a_second_api_server_and_says_why():
    space = gpu_space("0, GPU-1, 81559, NVIDIA H100 80GB HBM3\n")
    servers = space["api-server-count"]
    assert (servers.kind, servers.choices) == ("categorical", (1, 2))
    # stream-interval changes what a streaming client receives; async-scheduling is already on.
    assert "stream-interval" not in space and "async-scheduling" not in space
    header = default_spec_text("m", gpu=True).split("\nmodel:")[0]
    assert "api-server-count: the HTTP front-end processes" in header
    assert "benchmarks/results/gpu-frontend-knobs/" in header
    # How a spec whose clients accept chunked streams adds stream-interval, as YAML that parses.
    line = next(line for line in header.splitlines() if "stream-interval: {" in line)
    added = yaml.safe_load(line.lstrip("# ").split(" (", 1)[0])
    assert parse_spec({"search_space": added}).space[0].choices == (1, 4)


def test_the_cpu_default_space_stays_1_to_32():
    text = default_spec_text("m")
    seqs = {d.name: d for d in parse_spec(yaml.safe_load(text)).space}["max-num-seqs"]
    assert (seqs.low, seqs.high, seqs.log) == (1, 32, False)
    assert "vLLM's own default" not in text
    assert "api-server-count" not in text
    demo = parse_spec(yaml.safe_load(DEMO.read_text()))
    assert {d.name: d for d in demo.space}["max-num-seqs"].high == 32


def test_a_gpu_capacity_spec_warms_every_engine_up_and_says_why():
    capacity = default_spec_text(
        "m", gpu=True, overrides={"objective_mode": "capacity"}, searches_rates=True
    )
    header = capacity.split("\nmodel:")[0]
    assert parse_spec(yaml.safe_load(capacity)).warmup_requests == GPU_CAPACITY_WARMUP_REQUESTS
    assert "judged cold (benchmarks/results/h100-gate-warm/)" in header
    # A latency study on a GPU, and any study on vLLM's CPU build, start measuring at once.
    for text in (
        default_spec_text("m", gpu=True),
        default_spec_text("m", overrides={"objective_mode": "capacity"}, searches_rates=True),
    ):
        assert parse_spec(yaml.safe_load(text)).warmup_requests == 0
        assert "warmup_requests: 200" not in text


def test_long_prompts_move_max_num_batched_tokens_first_and_say_why():
    device = first_gpu("0, GPU-1, 81559, NVIDIA H100 80GB HBM3\n")

    def order(prompts: list[int]) -> tuple[list[str], str]:
        text = default_spec_text("m", gpu=True, prompt_tokens=prompts, device=device)
        return [d.name for d in parse_spec(yaml.safe_load(text)).space], text.split("\nmodel:")[0]

    # Short prompts (the story trace's shape): the front end first, the chunk size fourth.
    names, header = order(PROMPTS)
    assert names[0] == "api-server-count" and names.index("max-num-batched-tokens") == 3
    assert "max-num-batched-tokens: the prefill" not in header
    # 1,024 tokens or more on average: prefill is the main work, so its chunk moves first.
    names, header = order([400] * 3 + [4000])
    assert names[0] == "max-num-batched-tokens" and len(names) == len(set(names)) == 5
    assert "max-num-batched-tokens: the prefill tokens a step may carry; first" in header
    assert "benchmarks/results/h100-code-7b/" in header
    space = {
        d.name: d
        for d in parse_spec(
            yaml.safe_load(default_spec_text("m", gpu=True, prompt_tokens=[1024], device=device))
        ).space
    }
    # Its levels: a factor of 4 below vLLM's default, which stays the default, listed from the
    # largest down so that the search moves down first.
    assert space["max-num-batched-tokens"].choices == (16384, 8192, 2048)
    assert space["max-num-batched-tokens"].default == 8192
    short = {
        d.name: d
        for d in parse_spec(
            yaml.safe_load(default_spec_text("m", gpu=True, prompt_tokens=PROMPTS, device=device))
        ).space
    }
    assert short["max-num-batched-tokens"].choices == (2048, 4096, 8192, 16384)
    assert order([1023])[0][0] == "api-server-count"


def test_the_gpu_space_starts_from_the_installed_vllms_defaults():
    """Where the vLLM installed says (``tuner.engine.vllm_defaults``), its max-num-seqs and
    max-num-batched-tokens replace tuner's table (1024 and 8192 on an H100): the ceiling and
    default of max-num-seqs, the capture range vLLM takes at it, and a batched-tokens level."""
    device = first_gpu("0, GPU-1, 81559, NVIDIA H100 80GB HBM3\n")
    batch = BatchDefaults("cuda", 512, 6144)
    text = default_spec_text("m", gpu=True, prompt_tokens=PROMPTS, device=device, batch=batch)
    space = {d.name: d for d in parse_spec(yaml.safe_load(text)).space}
    assert (space["max-num-seqs"].high, space["max-num-seqs"].default) == (512, 512)
    assert space["max-num-batched-tokens"].default == 6144
    assert 6144 in space["max-num-batched-tokens"].choices
    assert space[MAX_CAPTURE_SIZE].default == 512  # twice 512, at most 512
    # Asked of the CPU build, the answer is not this GPU's: tuner's table.
    cpu = BatchDefaults("cpu", 128, 2048)
    text = default_spec_text("m", gpu=True, prompt_tokens=PROMPTS, device=device, batch=cpu)
    space = {d.name: d for d in parse_spec(yaml.safe_load(text)).space}
    assert (space["max-num-seqs"].high, space["max-num-batched-tokens"].default) == (1024, 8192)


def test_the_cpu_space_takes_the_cpu_builds_defaults_and_keeps_its_range():
    text = default_spec_text("m", batch=BatchDefaults("cpu", 64, 1024))
    space = {d.name: d for d in parse_spec(yaml.safe_load(text)).space}
    assert space["max-num-seqs"].default == 64 and space["max-num-seqs"].high == 32
    assert space["max-num-batched-tokens"].default == 1024
    assert table_batch_defaults(False, None) == (128, 2048)
