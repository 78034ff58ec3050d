"""vLLM's own max-num-seqs and max-num-batched-tokens, asked of the vLLM installed
(``tuner.engine.vllm_defaults``), kept on disk, and what ``tuner init`` says of them."""

from __future__ import annotations

import json

import pytest

from tuner.cli import spec as cli_spec
from tuner.engine import vllm_defaults
from tuner.engine.vllm_defaults import Asked, BatchDefaults
from tuner.study.plan.space import table_batch_defaults


@pytest.mark.vllm
def test_the_cpu_build_gives_its_own_and_the_answer_is_kept(tmp_path, monkeypatch):
    """vLLM 0.32.0's CPU build: 128 sequences and 2048 tokens a step for its API server, the
    values of tuner's table; asked once, then read from the cache."""
    cache = tmp_path / "vllm-defaults.json"
    asked = vllm_defaults.installed(None, cache)
    assert asked.defaults == BatchDefaults("cpu", *table_batch_defaults(False, None))
    assert list(json.loads(cache.read_text()).values()) == [
        {"platform": "cpu", "max_num_seqs": 128, "max_num_batched_tokens": 2048}
    ]

    def no_child() -> Asked:
        raise AssertionError("asked vLLM again")

    monkeypatch.setattr(vllm_defaults, "_ask", no_child)
    assert vllm_defaults.installed(None, cache) == asked


def test_a_vllm_that_cannot_say_is_named_and_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_defaults, "SCRIPT", "raise SystemExit('no vLLM here')")
    cache = tmp_path / "vllm-defaults.json"
    asked = vllm_defaults.installed(None, cache)
    assert asked.defaults is None and asked.why_not == "asking vLLM failed: no vLLM here"
    assert not cache.exists()
    monkeypatch.setattr(vllm_defaults, "SCRIPT", "print('max_num_seqs: 7')")
    assert "cannot read: max_num_seqs: 7" in vllm_defaults.installed(None, cache).why_not


def _answering(asked: Asked):
    """A stand-in for ``vllm_defaults.installed`` that gives ``asked`` for any device."""
    return lambda device: asked


def test_init_says_where_the_installed_vllm_differs_from_tuners_table(monkeypatch, capsys):
    said = BatchDefaults("cpu", 64, 1024)
    monkeypatch.setattr(vllm_defaults, "installed", _answering(Asked(said)))
    assert cli_spec._installed_defaults(False, None) == said
    out = capsys.readouterr().out
    assert "max-num-seqs 64, max-num-batched-tokens 1024 (tuner's table: 128, 2048)" in out
    # The same as the table: nothing to say.
    monkeypatch.setattr(
        vllm_defaults, "installed", _answering(Asked(BatchDefaults("cpu", 128, 2048)))
    )
    assert cli_spec._installed_defaults(False, None) is not None
    assert capsys.readouterr().out == ""
    # Not read: the table's, said; asked of the CPU build for a GPU spec: the table's, unsaid.
    monkeypatch.setattr(
        vllm_defaults, "installed", _answering(Asked(None, "asking vLLM failed: x"))
    )
    assert cli_spec._installed_defaults(False, None) is None
    assert "not read from the vLLM installed (asking vLLM failed: x)" in capsys.readouterr().out
    monkeypatch.setattr(vllm_defaults, "installed", _answering(Asked(said)))
    assert cli_spec._installed_defaults(True, None) is None
    assert capsys.readouterr().out == ""
