"""Prompts: exact lengths, the same ids every time, and the trace's shared prefix blocks."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.load.http import ReplaySettings, request_body
from tuner.load.prompts import prompt_token_ids
from tuner.traces.model import Request

VOCAB = 8192


@given(
    index=st.integers(0, 10_000),
    input_tokens=st.integers(1, 3000),
    hash_ids=st.lists(st.integers(0, 50), max_size=8).map(tuple),
    block_tokens=st.sampled_from([0, 1, 16, 64]),
)
def test_exact_length_and_valid_ids(index, input_tokens, hash_ids, block_tokens):
    request = Request(0.0, input_tokens, 5, hash_ids)
    ids = prompt_token_ids(index, request, VOCAB, block_tokens)
    assert len(ids) == input_tokens
    assert all(type(i) is int and 1 <= i < VOCAB for i in ids)


def test_same_inputs_same_prompt():
    request = Request(0.0, 300, 5)
    assert prompt_token_ids(7, request, VOCAB) == prompt_token_ids(7, request, VOCAB)
    assert prompt_token_ids(7, request, VOCAB, seed=1) == prompt_token_ids(
        7, request, VOCAB, seed=1
    )


def test_index_and_seed_change_the_prompt():
    request = Request(0.0, 300, 5)
    base = prompt_token_ids(7, request, VOCAB)
    assert prompt_token_ids(8, request, VOCAB) != base
    assert prompt_token_ids(7, request, VOCAB, seed=1) != base


def test_without_hash_ids_prompts_share_no_prefix():
    a = prompt_token_ids(0, Request(0.0, 64, 1), VOCAB, block_tokens=16)
    b = prompt_token_ids(1, Request(0.0, 64, 1), VOCAB, block_tokens=16)
    assert a[:4] != b[:4]


def test_shared_hash_ids_give_shared_blocks():
    block = 16
    a = prompt_token_ids(0, Request(0.0, 60, 1, (1, 2, 3)), VOCAB, block)
    b = prompt_token_ids(1, Request(0.0, 70, 1, (1, 2, 9)), VOCAB, block)
    c = prompt_token_ids(2, Request(0.0, 40, 1, (5, 2)), VOCAB, block)
    assert a[:32] == b[:32]  # blocks 1 and 2
    assert a[32:48] != b[32:48]  # block 3 against block 9
    assert a[48:] != b[48:60]  # each request's own tail
    # A block is the same wherever it sits: block 2 is second in c too.
    assert c[16:32] == a[16:32]
    assert c[:16] != a[:16]


def test_a_prompt_shorter_than_its_blocks_is_cut():
    long = prompt_token_ids(0, Request(0.0, 48, 1, (4, 5, 6)), VOCAB, 16)
    short = prompt_token_ids(1, Request(0.0, 20, 1, (4, 5, 6)), VOCAB, 16)
    assert short == long[:20]


def test_prompt_ids_follow_seed_for_shared_blocks():
    a = prompt_token_ids(0, Request(0.0, 16, 1, (1,)), VOCAB, 16, seed=0)
    b = prompt_token_ids(0, Request(0.0, 16, 1, (1,)), VOCAB, 16, seed=1)
    assert a != b


def test_tiny_vocab_rejected():
    with pytest.raises(ValueError):
        prompt_token_ids(0, Request(0.0, 4, 1), 1)


def test_request_body_forces_the_output_length():
    settings = ReplaySettings(model="m", vocab_size=VOCAB, block_tokens=16, seed=3)
    request = Request(1.5, 40, 17, (1, 2))
    body = json.loads(request_body(4, request, settings))
    assert body["prompt"] == prompt_token_ids(4, request, VOCAB, 16, 3)
    assert body["model"] == "m"
    assert body["max_tokens"] == body["min_tokens"] == 17
    assert body["ignore_eos"] is True
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
