"""Prompts as token-id lists, of a trace's lengths, with the trace's prefix sharing.

Pure and deterministic: the same trace and seed give the same prompts, so every trial of a
study replays identical requests.
"""

from __future__ import annotations

import numpy as np

from tuner.traces.model import Request

# Token 0 is the dummy tokenizer's end of sequence; prompts use 1 .. vocab_size - 1.
_FIRST_TOKEN = 1


def _tokens(seed: int, stream: int, key: int, count: int, vocab_size: int) -> list[int]:
    rng = np.random.default_rng([seed, stream, key])
    return rng.integers(_FIRST_TOKEN, vocab_size, size=count).tolist()


def prompt_token_ids(
    index: int,
    request: Request,
    vocab_size: int,
    block_tokens: int = 0,
    seed: int = 0,
    history: frozenset[int] = frozenset(),
    history_seed: int = 0,
) -> list[int]:
    """The prompt of request ``index``: exactly ``request.input_tokens`` ids.

    Requests with ``hash_ids`` begin with one block of ``block_tokens`` ids per hash id, equal
    ids giving equal blocks, so vLLM's prefix cache sees the sharing the trace recorded. A hash
    id in ``history`` (a block the trace sent before the replayed window) is drawn from
    ``history_seed``, any other from ``seed``: windows replayed with different seeds then share
    the trace's history, as one server serving the trace would, and nothing else. The rest of
    every prompt is drawn for that request alone and shares nothing.
    """
    if vocab_size <= _FIRST_TOKEN:
        raise ValueError("vocab_size too small for prompts")
    ids: list[int] = []
    if request.hash_ids and block_tokens > 0:
        for hash_id in request.hash_ids:
            if len(ids) >= request.input_tokens:
                break
            block_seed = history_seed if hash_id in history else seed
            ids += _tokens(block_seed, 1, hash_id, block_tokens, vocab_size)
    ids = ids[: request.input_tokens]
    ids += _tokens(seed, 2, index, request.input_tokens - len(ids), vocab_size)
    return ids


# Fewer words than this and text prompts repeat too often to stand for distinct requests.
_FEWEST_WORDS = 20
# Enough that two unrelated prompts share no block of words by chance; a large vocabulary is
# not read to its end (each token is decoded and encoded again).
_MOST_WORDS = 4096


def prompt_words(model: str) -> tuple[str, ...]:
    """Pieces of text that ``model``'s tokenizer reads back as one token each, for text prompts
    (``tuner.load.template``): its tokens that decode to letters (at most ``_MOST_WORDS``),
    with a space before them where the tokenizer has enough such (a byte-pair tokenizer then
    reads each word alone, so a prompt of ``n`` words is ``n`` tokens), else without.

    Raises ``ValueError`` where the tokenizer has too few such tokens.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    spaced: list[str] = []
    bare: list[str] = []
    for token_id in range(len(tokenizer)):
        text = str(tokenizer.decode([token_id]))
        word = text[1:] if text.startswith(" ") else text
        if not (word.isascii() and word.isalpha()):
            continue
        if tokenizer.encode(text, add_special_tokens=False) != [token_id]:
            continue
        (spaced if text.startswith(" ") else bare).append(text)
        if len(spaced) >= _MOST_WORDS:
            break
    words = spaced if len(spaced) >= _FEWEST_WORDS else bare
    if len(words) < _FEWEST_WORDS:
        raise ValueError(f"{model}'s tokenizer has too few word tokens for text prompts")
    return tuple(words)
