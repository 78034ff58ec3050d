"""The live status line: rewritten in place on a terminal, silent anywhere else; and what the
replay's monitor tells it (every tick) against what it tells the pruner (every 5 s)."""

from __future__ import annotations

import io

import pytest

from tuner.cli.progress import ERASE_LINE, StatusLine, describe
from tuner.load.metrics import LiveRequest
from tuner.study.measure.trial import (
    PRUNE_INTERVAL_S,
    REPLAY,
    STARTING,
    STOPPING,
    WARMUP,
    Criteria,
    TrialProgress,
    _monitor,
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


REPLAYING = TrialProgress(REPLAY, 12.4, sending_s=60.0, done=140, total=720, ttft_p95_s=1.2344)


def test_describe_each_phase():
    assert describe(TrialProgress(STARTING, 34.2)) == "starting vLLM 34 s"
    assert describe(REPLAYING) == "replay 12/60 s, 140/720 done, TTFT p95 1234 ms"
    assert describe(TrialProgress(WARMUP, 1.0, sending_s=3.0, total=8)) == (
        "warm-up 1/3 s, 0/8 done, TTFT p95 -"
    )
    # Past the last send, while the last requests finish; a closed loop has no total.
    assert describe(TrialProgress(REPLAY, 65.0, sending_s=60.0, done=700, ttft_p95_s=0.05)) == (
        "replay 65 s (all sent by 60 s, finishing), 700 done, TTFT p95 50 ms"
    )
    assert describe(TrialProgress(STOPPING)) == "stopping vLLM"


def test_status_line_on_a_terminal_is_rewritten_in_place_and_cleared():
    out = Terminal()
    status = StatusLine(out, columns=200)
    assert status.live
    status.begin(3, "max-num-seqs=12")
    status.show(TrialProgress(STARTING, 1.0))
    status.show(TrialProgress(STARTING, 1.2))  # the same text: not written again
    status.show(REPLAYING)
    status.clear()
    status.clear()  # nothing shown: nothing to erase
    assert out.getvalue() == (
        f"{ERASE_LINE}trial   3  starting vLLM 1 s  max-num-seqs=12"
        f"{ERASE_LINE}trial   3  replay 12/60 s, 140/720 done, TTFT p95 1234 ms  max-num-seqs=12"
        f"{ERASE_LINE}"
    )
    assert "\n" not in out.getvalue()


def test_status_line_is_cut_to_the_terminal_width_and_kept_on_an_interrupt():
    out = Terminal()
    status = StatusLine(out, columns=30)
    status.begin(3, "max-num-seqs=12 max-num-batched-tokens=8192")
    status.show(REPLAYING)
    status.keep()
    # One column short of the terminal's 30: the cursor never wraps to a second line.
    assert out.getvalue() == f"{ERASE_LINE}trial   3  replay 12/60 s, 14\n"
    status.clear()  # kept: nothing left to erase
    assert out.getvalue().endswith("\n")


def test_status_line_elsewhere_writes_nothing():
    out = io.StringIO()
    status = StatusLine(out, columns=200)
    assert not status.live
    status.begin(0, "(vLLM defaults)")
    for progress in (TrialProgress(STARTING, 5.0), REPLAYING, TrialProgress(STOPPING)):
        status.show(progress)
    status.clear()
    status.keep()
    assert out.getvalue() == ""


def test_monitor_tells_progress_every_tick_and_the_pruner_every_5_s():
    criteria = Criteria(slos={"ttft_p95_s": 1.0}, weights={"ttft_p95_s": 1.0})
    told: list[TrialProgress] = []
    asked: list[tuple[int, float]] = []

    def should_stop(step: int, value: float) -> bool:
        asked.append((step, value))
        return False

    start = TrialProgress(REPLAY, sending_s=10.0, total=3)
    monitor = _monitor(criteria, should_stop, told.append, start)
    assert monitor is not None
    live = [
        LiveRequest(0.0, first_token_s=0.5, done_s=0.9),
        LiveRequest(0.5, 2.5),
        LiveRequest(1.0),
    ]
    for tick in range(1, 12):
        assert monitor(tick + 0.01, live) is False
    assert [t.elapsed_s for t in told] == [tick + 0.01 for tick in range(1, 12)]
    assert all(t.done == 1 and t.total == 3 and t.sending_s == 10.0 for t in told)
    # Over the two first tokens so far, 0.5 s and 2.0 s after their sends.
    assert told[0].ttft_p95_s == pytest.approx(0.5 + 0.95 * 1.5)
    assert [step for step, _ in asked] == [5, 10]
    assert PRUNE_INTERVAL_S == 5.0
    # Neither a pruner nor a display: no monitor at all, nothing computed during the replay.
    assert _monitor(criteria, None, None, start) is None
