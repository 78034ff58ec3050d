"""Where a trial's time went: the line built from the figures a trial recorded of vLLM's
``/metrics``, and the reading given where vLLM's defaults are kept; then as ``tuner run`` prints
it and writes it into the YAML header, and as ``tuner report`` shows it, for studies filled by a
scripted runner (``test_confirm``'s) whose trials carry hand-made figures."""

from __future__ import annotations

import re
from dataclasses import replace
from html import escape
from typing import Any

import optuna
import pytest
from test_confirm import Scripted, run_scripted, written_and_reported

from tuner.cli.exits import EXIT_DEFAULTS_KEPT
from tuner.cli.main import main
from tuner.cli.result import overhead_summary
from tuner.study.measure.time_spent import (
    TimeSpent,
    reading,
    stalls,
    time_line,
    time_lines,
    time_spent,
)
from tuner.study.measure.trial import TrialOutcome
from tuner.study.result.choice import choose

# The figures of the H100 study of the conversation trace on a 7B model (vLLM's defaults).
GPU_DEFAULTS: dict[str, Any] = {
    "server_queue_mean_s": 0.003,
    "server_prefill_mean_s": 0.12,
    "server_decode_mean_s": 2.8,
    "kv_cache_usage_peak": 0.14,
    "kv_cache_usage_mean": 0.08,
    "server_preemptions": 0.0,
    "waiting_peak": 1.0,
    "running_mean": 48.3,
    "running_peak": 70.0,
    "ttft_p95_s": 0.2,
}
LINE = (
    "where the time went (trial 0): queue 3 ms, prefill 120 ms, decode 2.8 s a request; "
    "KV cache peak 14%, 0 preemptions, waiting peak 1, 48 running on average of max-num-seqs 1024"
)


def test_the_figures_are_read_from_the_attributes():
    spent = time_spent(GPU_DEFAULTS, default_max_num_seqs=1024)
    assert spent == TimeSpent(0.003, 0.12, 2.8, 0.14, 0.0, 1.0, 48.3, 1024)


def test_the_line_names_each_figure():
    assert time_line(0, time_spent(GPU_DEFAULTS, 1024)) == LINE


def test_max_num_seqs_set_on_the_trial_wins_over_vllm_s_default():
    args = {"max-num-seqs": 64}
    assert time_spent(GPU_DEFAULTS, 1024, args).max_num_seqs == 64
    line = time_line(3, time_spent(GPU_DEFAULTS, 1024, args))
    assert line is not None and line.endswith("48 running on average of max-num-seqs 64")


def test_without_a_known_limit_the_running_mean_stands_alone():
    line = time_line(0, time_spent(GPU_DEFAULTS | {"running_mean": 2.25}))
    assert line is not None and line.endswith("waiting peak 1, 2.2 running on average")


def test_only_what_was_measured_is_said():
    # vLLM's CPU build without the queue, prefill and decode histograms: the gauges only.
    gauges = {k: GPU_DEFAULTS[k] for k in ("kv_cache_usage_peak", "waiting_peak", "running_mean")}
    assert time_line(2, time_spent(gauges)) == (
        "where the time went (trial 2): KV cache peak 14%, waiting peak 1, 48 running on average"
    )
    times = {k: GPU_DEFAULTS[k] for k in ("server_prefill_mean_s", "server_decode_mean_s")}
    assert time_line(2, time_spent(times)) == (
        "where the time went (trial 2): prefill 120 ms, decode 2.8 s a request"
    )


def test_no_figure_no_line():
    assert time_line(0, time_spent({"ttft_p95_s": 0.2}, None, {"max-num-seqs": 8})) is None
    assert time_lines(0, {"ttft_p95_s": 0.2}, {"max-num-seqs": 128}, defaults_kept=True) == []


def test_the_prefix_cache_hit_rate_is_the_share_of_prompt_tokens_found():
    """vLLM's CPU build on a window of Mooncake's trace (prompts that share prefixes), its
    counters of prompt tokens looked up in the prefix cache and found there."""
    counted = GPU_DEFAULTS | {
        "server_prefix_cache_queries": 624022.0,
        "server_prefix_cache_hits": 99328.0,
    }
    spent = time_spent(counted, 1024)
    assert spent.prefix_cache_hit_rate == pytest.approx(0.159, abs=0.001)
    assert "KV cache peak 14%, prefix cache hits 16% of prompt tokens, 0 preemptions" in (
        time_line(0, spent) or ""
    )
    # Hits on a cache primed with what the trace sent before the window say so.
    primed = time_line(0, time_spent(counted | {"prefix_primed_tokens": 118272.0}, 1024))
    assert "prefix cache hits 16% of prompt tokens (primed with the trace's earlier blocks)" in (
        primed or ""
    )
    # None looked up (a build without the counters, or no prompt in the window): not said.
    for quiet in (GPU_DEFAULTS, counted | {"server_prefix_cache_queries": 0.0}):
        assert "prefix cache" not in (time_line(0, time_spent(quiet, 1024)) or "")


def test_one_preemption_is_singular_and_counts_are_whole():
    line = time_line(1, time_spent({"server_preemptions": 1.0}))
    assert line == "where the time went (trial 1): 1 preemption"
    assert time_line(1, time_spent({"server_preemptions": 12.0})).endswith("12 preemptions")


def test_no_queue_and_no_pressure_is_read_as_compute():
    said = reading(time_spent(GPU_DEFAULTS))
    assert said is not None and said.startswith("no queue and no memory pressure")


@pytest.mark.parametrize(
    "change",
    [
        {"waiting_peak": 5.0},  # requests waited for a slot
        {"server_queue_mean_s": 0.2},  # 7% of prefill and decode spent queued
        {"server_preemptions": 3.0},
        {"kv_cache_usage_peak": 0.95},
    ],
)
def test_a_queue_or_memory_pressure_gets_no_reading(change):
    assert reading(time_spent(GPU_DEFAULTS | change)) is None


@pytest.mark.parametrize(
    "missing", ["server_queue_mean_s", "server_decode_mean_s", "kv_cache_usage_peak"]
)
def test_a_missing_figure_gets_no_reading(missing):
    attrs = {k: v for k, v in GPU_DEFAULTS.items() if k != missing}
    assert reading(time_spent(attrs)) is None


def test_the_reading_only_where_the_defaults_are_kept():
    kept = time_lines(0, GPU_DEFAULTS, {"max-num-seqs": 1024}, defaults_kept=True)
    assert kept[0] == LINE and len(kept) == 2 and kept[1].startswith("no queue")
    assert time_lines(0, GPU_DEFAULTS, {"max-num-seqs": 1024}, defaults_kept=False) == [LINE]


# The code trace's defaults at capacity on one H100 (benchmarks/results/h100-code-7b/): an
# inter-token latency p95 of 41.6 ms, a median in vLLM's first bucket (at most 10 ms), 174,849
# prompt tokens over 110 requests.
STALLED = GPU_DEFAULTS | {
    "server_itl_p95_s": 0.0416,
    "server_itl_p50_at_most_s": 0.01,
    "server_prompt_tokens": 174849.0,
    "server_requests_succeeded": 110.0,
}


def test_decode_steps_held_up_by_long_prefills_are_read_as_such():
    said = stalls(time_spent(STALLED))
    assert said == (
        "decode steps wait on prefill: inter-token latency p95 41.6 ms against a median of at "
        "most 10 ms, with prompts of 1590 tokens on average; a step that carries a prefill "
        "chunk (up to max-num-batched-tokens tokens) holds up the decodes beside it, so a "
        "smaller max-num-batched-tokens trades TTFT for TPOT"
    )
    # Written after the line and the reading where the defaults are kept, not otherwise.
    kept = time_lines(0, STALLED, {"max-num-seqs": 1024}, defaults_kept=True)
    assert len(kept) == 3 and kept[1].startswith("no queue") and kept[2] == said
    assert len(time_lines(0, STALLED, {"max-num-seqs": 1024}, defaults_kept=False)) == 1
    # An exact median is said as such.
    exact = {k: v for k, v in STALLED.items() if k != "server_itl_p50_at_most_s"}
    exact["server_itl_p50_s"] = 0.012
    assert "against a median of 12 ms," in time_lines(0, exact, {}, defaults_kept=True)[-1]


@pytest.mark.parametrize(
    "change",
    [
        # Short prompts (the story trace's, 106 tokens): a tail of other causes, not said.
        {"server_prompt_tokens": 110 * 106.0},
        # A tail under 3 times the median (the CPU demo's: 9.7 ms against 5.1 ms).
        {"server_itl_p95_s": 0.029},
        {"server_preemptions": 2.0},
        {"server_requests_succeeded": 0.0},
    ],
)
def test_no_stall_reading_without_long_prompts_and_a_long_tail(change):
    assert stalls(time_spent(STALLED | change)) is None
    missing = {k: v for k, v in STALLED.items() if k != "server_itl_p95_s"}
    assert stalls(time_spent(missing)) is None


def test_a_default_that_is_not_a_count_is_not_shown():
    lines = time_lines(0, GPU_DEFAULTS, {"max-num-seqs": None}, defaults_kept=False)
    assert lines[0].endswith("48 running on average")


class WithFigures(Scripted):
    """The scripted scores, each trial with vLLM's figures of the H100 study."""

    def __call__(self, args, setup, workdir, should_stop=None) -> TrialOutcome:
        outcome = super().__call__(args, setup, workdir, should_stop)
        return replace(outcome, metrics={**outcome.metrics, **FIGURES})


FIGURES = {k: v for k, v in GPU_DEFAULTS.items() if k != "ttft_p95_s"}
# The line of a trial run at vLLM's defaults: the scripted spec gives no default max-num-seqs.
AT_DEFAULTS = LINE.removesuffix(" of max-num-seqs 1024").removeprefix(
    "where the time went (trial 0)"
)


def test_the_header_says_where_the_kept_defaults_spent_their_time(tmp_path, cpu_model, capsys):
    scripted = WithFigures({None: [1.0, 0.7, 1.1], 4: [0.8, 0.85, 0.75], 8: [3.0]})
    study, _, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=2)
    assert main(args) == EXIT_DEFAULTS_KEPT
    written = choose(study)
    assert written is not None and written.keeps_defaults
    line = f"where the time went (trial {written.trial.number}){AT_DEFAULTS}"
    header = (tmp_path / "configs" / "s.yaml").read_text().split("# Serve with")[0]
    assert f"# {line}\n# no queue and no memory pressure: " in header
    out = capsys.readouterr().out
    assert f"{line}\nno queue and no memory pressure: " in out


def test_a_tuned_configuration_gets_its_line_and_no_reading(tmp_path, cpu_model, capsys):
    scores = {None: [0.97, 0.99, 0.96, 1.0], 4: [0.9], 8: [0.6, 0.58, 0.62, 0.6]}
    _, _, args = run_scripted(tmp_path, cpu_model, WithFigures(scores), top_k=1, repeats=3)
    written, page = written_and_reported(tmp_path, args)
    assert written == 7  # max-num-seqs 8's median fresh measurement (0.6)
    line = f"where the time went (trial 7){AT_DEFAULTS} of max-num-seqs 8"
    header = (tmp_path / "configs" / "s.yaml").read_text()
    assert f"# {line}\n" in header and "no queue" not in header
    # The report says it of the chosen trial, then of vLLM's defaults, through the same lines.
    baseline = f"where the time went (trial 0){AT_DEFAULTS}"
    assert f'<ul id="time-spent"><li>{escape(line)}</li><li>{escape(baseline)}</li></ul>' in page


def test_the_report_reads_the_kept_defaults_as_tuner_run_does(tmp_path, cpu_model, capsys):
    scripted = WithFigures({None: [1.0, 0.7, 1.1], 4: [0.8, 0.85, 0.75], 8: [3.0]})
    _, _, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=2)
    written, page = written_and_reported(tmp_path, args)
    said = re.search(r'<ul id="time-spent">(.*?)</ul>', page)
    assert said is not None
    items = re.findall(r"<li>(.*?)</li>", said[1])
    # The chosen trial is one of the baseline's measurements: it alone, and the reading.
    assert items[0] == escape(f"where the time went (trial {written}){AT_DEFAULTS}")
    assert len(items) == 2 and items[1].startswith("no queue and no memory pressure")


def test_without_vllm_s_figures_nothing_is_said(tmp_path, cpu_model, capsys):
    scripted = Scripted({None: [1.0, 0.7, 1.1], 4: [0.8, 0.85, 0.75], 8: [3.0]})
    _, _, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=2)
    _, page = written_and_reported(tmp_path, args)
    assert "where the time went" not in (tmp_path / "configs" / "s.yaml").read_text()
    assert "where the time went" not in capsys.readouterr().out
    assert 'id="time-spent"' not in page


def test_the_run_s_overhead_line_names_the_time_spent_priming() -> None:
    """Priming the prefix cache runs inside a capacity trial's measurement: the run's last line
    says how much of it, where a rate primed at all."""
    study = optuna.create_study(direction="maximize")
    points = [{"rate_req_per_s": r, "prefix_prime_s": s} for r, s in ((2.0, 40.0), (4.0, 3.5))]
    for attrs in (
        {"time_trial_s": 300.0, "time_window_s": 200.0, "capacity_points": points},
        {"time_trial_s": 100.0, "time_window_s": 60.0, "capacity_points": [{"rate_req_per_s": 3}]},
    ):
        study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs=attrs))
    assert overhead_summary(study, 0) == (
        "trial time 400 s, of which measurement 260 s (priming the prefix cache 44 s): overhead 35%"
    )
    assert "priming" not in overhead_summary(study, 1)
