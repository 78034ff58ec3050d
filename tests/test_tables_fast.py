"""The JSONL fast paths agree with the line-by-line reader, on usual and unusual files."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tuner.errors import TraceError
from tuner.traces.jsonl_reader import _read_jsonl_rows, _read_jsonl_scanned, read_jsonl
from tuner.traces.model import IntLists
from tuner.traces.table import Kind, Table

MOONCAKE: dict[str, Kind] = {"timestamp": "time", "input_length": "number"}
MOONCAKE["output_length"] = "number"
CHATS: dict[str, Kind] = MOONCAKE | {"chat_id": "text"}
READS = [  # (wanted, lists, optional) as formats.py asks for them, and a stricter one
    (MOONCAKE, ("hash_ids",), ("hash_ids",)),
    (CHATS, ("hash_ids",), ("chat_id",)),
]
KEYS = ("timestamp", "input_length", "output_length", "hash_ids", "chat_id")


def outcome(read: Any, text: str, wanted: Any, lists: Any, optional: Any) -> Any:
    """What a reader makes of ``text``: its error message, or every value, bit for bit."""
    try:
        result = read("t.jsonl", text, wanted, lists, optional)
    except TraceError as exc:
        return str(exc)
    return values(result)


def values(result: tuple[Table, dict[str, IntLists]]) -> Any:
    table, flat = result
    columns = {
        name: column.tobytes() if column.dtype.kind == "f" else column.tolist()
        for name, column in table.columns.items()
    }
    lines = [table.line_of(row) for row in range(len(table))]
    ids = {name: (ids.tolist(), offsets.tolist()) for name, (ids, offsets) in flat.items()}
    return columns, lines, ids


def assert_agree(text: str, chunk_chars: int = 1 << 20) -> bool:
    """The scanned and the public reader agree with the line reader; whether the scan took it."""
    scanned_any = False
    for wanted, lists, optional in READS:
        exact = outcome(_read_jsonl_rows, text, wanted, lists, optional)
        assert outcome(read_jsonl, text, wanted, lists, optional) == exact
        scanned = _read_jsonl_scanned("t.jsonl", text, wanted, lists, optional, chunk_chars)
        if scanned is not None:
            assert values(scanned) == exact
            scanned_any = True
    return scanned_any


def lines(*records: dict[str, Any], separators: tuple[str, str] | None = None) -> str:
    return "".join(json.dumps(r, separators=separators) + "\n" for r in records)


ROW = {"timestamp": 6, "input_length": 1016, "output_length": 728, "hash_ids": [0, 1]}
ROWS: list[dict[str, Any]] = [
    ROW,
    {"timestamp": 16, "input_length": 4876, "output_length": 326, "hash_ids": list(range(10))},
    {"timestamp": 17, "input_length": 2647, "output_length": 639, "hash_ids": []},
    {"timestamp": 1500, "input_length": 600, "output_length": 7, "hash_ids": [123456789012]},
]
CHAT_ROWS = [r | {"chat_id": n} for n, r in enumerate(ROWS)]


@pytest.mark.parametrize(
    "text",
    [
        lines(*ROWS),
        lines(*ROWS, separators=(",", ":")),
        lines(*CHAT_ROWS),
        lines(*ROWS).rstrip("\n"),  # no line end after the last record
        "\n\n" + lines(*ROWS[:2]) + "\n\n" + lines(*ROWS[2:]) + "\n\n",  # blank lines
        lines(*(r | {"timestamp": r["timestamp"] + 0.25} for r in ROWS)),  # seconds as floats
        lines(*(r | {"timestamp": -r["timestamp"]} for r in ROWS)),
        lines(*({k: v for k, v in r.items() if k != "hash_ids"} for r in ROWS)),  # optional
        lines(ROW | {"timestamp": 2**53 + 1}, ROW | {"timestamp": 9999999999999999}),
        lines(*(ROW | {"timestamp": t} for t in (0.1 + 0.2, 0.0015, -0.0, 123456.789))),
        lines(ROW | {"hash_ids": [0, 10**15, 99999999, 100000000]}),
        lines(ROW | {"extra_key": 3}, ROW | {"extra_key": 4.5}),
        lines(ROW | {"more": [3]}, ROW | {"more": []}),
    ],
)
def test_usual_files_take_the_scan_and_agree(text):
    assert assert_agree(text)
    for chunk_chars in (1, 7, 80):  # records split over many chunks
        assert assert_agree(text, chunk_chars)


@pytest.mark.parametrize(
    "text",
    [
        lines(ROW, dict(reversed(ROW.items()))),  # key order changes
        lines(ROW) + lines(ROW).replace(": ", ":\t"),  # other whitespace
        lines(ROW) + lines(ROW).replace('"timestamp": ', '"timestamp" : '),
        lines(ROW) + " " + lines(ROW),
        lines(ROW, {k: v for k, v in ROW.items() if k != "hash_ids"}),  # key missing in one line
        lines(ROW, {k: v for k, v in ROW.items() if k != "input_length"}),
        lines(ROW, ROW | {"ünïcode": 1}),
        lines(ROW | {"text": "ünïcode"}, ROW),
        lines(ROW | {"escaped": 'a"b\\c'}, ROW),
        lines(ROW) + lines(ROW)[:30],  # a truncated last line
        lines(ROW) + '{"timestamp": 1, "input_le',
        lines(ROW) + "[1, 2]\n",
        lines(ROW) + lines(ROW).replace("1016", "01016"),  # a leading zero
        lines(ROW) + lines(ROW).replace("1016", "1.016e3"),  # exponents: letters
        lines(ROW, ROW | {"timestamp": 1e-7}),
        lines(ROW) + lines(ROW).replace("1016", "1016.0"),
        lines(ROW) + lines(ROW).replace("1016", "-1016"),
        lines(ROW) + lines(ROW).replace("1016", "1-016"),
        lines(ROW) + lines(ROW).replace("1016", "10.1.6"),
        lines(ROW) + lines(ROW).replace("1016", "true"),
        lines(ROW) + lines(ROW).replace("1016", "null"),
        lines(ROW) + lines(ROW).replace("1016", "NaN"),
        lines(ROW) + lines(ROW).replace("1016", '"1016"'),
        lines(ROW) + lines(ROW).replace("1016", "123456789012345678901"),
        lines(ROW) + lines(ROW).replace("[0, 1]", "[0, -1]"),
        lines(ROW) + lines(ROW).replace("[0, 1]", "[0, 1.5]"),
        lines(ROW) + lines(ROW).replace("[0, 1]", "[0, 18446744073709551616]"),
        lines(ROW) + lines(ROW).replace("[0, 1]", "[0, [1]]"),
        lines(ROW) + lines(ROW).replace("[0, 1]", "[0,, 1]"),
        lines(ROW) + lines(ROW).replace("[0, 1]", "[0 1]"),
        lines(ROW) + lines(ROW).replace("[0, 1]", "0"),
        lines(ROW) + lines(ROW).replace("6,", "6,,"),
        lines(ROW) + lines(ROW).replace('"timestamp"', '"timestamp", "timestamp": 5'),
        lines(ROW) + lines(ROW).replace('"input_length"', '"output_length"'),
        lines(ROW) + lines(ROW).replace('"input_length"', '"input_lengthx"'),
        lines(ROW) + lines(ROW).replace('"input_length": 1016', '"input_length": 1016x'),
        lines(ROW) + lines(ROW).replace('"input_length": 1016', '"input": 1016_length'),
        lines(ROW) + lines(ROW).replace('"input_length": ', '"input_": length'),
        lines(ROW) + lines(ROW).replace("}", "}}"),
        lines(ROW) + lines(ROW).replace("{", "{{"),
        lines(ROW) + "\f\n" + lines(ROW),  # a blank line to str.strip, not to JSON
        lines(ROW | {"chat_id": "a"}, ROW | {"chat_id": "b"}),
        lines(ROW | {"extra_key": 3}, ROW | {"extra_key": [1, 2]}),
        lines(ROW | {"chat_id": 1.5}, ROW | {"chat_id": 2}),
        lines({"timestamp": 1}),
        "\n \n",
        "",
    ],
)
def test_unusual_files_agree(text):
    assert_agree(text)
    assert_agree(text, chunk_chars=7)


NUMBERS = st.one_of(
    st.integers(-3, 10**6),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -0.0, 0.5, 1e300, 2**53 + 1, 10**16, 10**17]),
)
PLAIN_NUMBERS = st.one_of(st.integers(0, 10**7), st.integers(-(10**6), 10**6).map(lambda n: n / 8))
IDS = st.lists(st.one_of(st.integers(0, 10**6), st.integers(-2, 2**65)), max_size=5)
PLAIN_IDS = st.lists(st.integers(0, 10**12), max_size=5)
ODD = st.sampled_from([True, None, "7", "ü", [1, [2]], {"a": 1}, 1.5, [], -1])
SEPARATORS = [(", ", ": "), (",", ":"), (", ", ":"), (" , ", " : ")]
INSERTS = [" ", "\t", "0", "-", ".", "e", ",", ":", "[", "]", "{", "}", "\n", '"', "x", "1", "é"]


@st.composite
def jsonl_texts(draw: st.DrawFn) -> str:
    """One shape, as json.dumps writes it, with something unusual now and then (often when not
    ``plain``)."""
    plain = draw(st.integers(0, 3)) > 0
    numbers, ids = (PLAIN_NUMBERS, PLAIN_IDS) if plain else (NUMBERS, IDS)
    odds = 40 if plain else 8
    separators = draw(st.sampled_from(SEPARATORS[:2] if plain else SEPARATORS))
    keys = draw(st.permutations([*KEYS[:3], *draw(st.sets(st.sampled_from(KEYS[3:])))]))
    values = {"hash_ids": ids, "chat_id": st.integers(0, 99) if plain else numbers}
    out = []
    for _ in range(draw(st.integers(1, 8))):
        record: dict[str, Any] = {k: draw(values.get(k, numbers)) for k in keys}
        if draw(st.integers(0, odds)) == 0:
            del record[draw(st.sampled_from(keys))]
        if draw(st.integers(0, odds)) == 0:
            record = dict(reversed(record.items()))
        if draw(st.integers(0, odds)) == 0:
            record[draw(st.sampled_from(KEYS))] = draw(ODD)
        out.append(json.dumps(record, separators=separators, ensure_ascii=draw(st.booleans())))
        if draw(st.integers(0, odds)) == 0:
            out.append(draw(st.sampled_from(["", " ", "\t", "[1]", "{}"])))
    ends = ["\n", "", "\n\n"] if plain else ["\n", "", "\n\n", '\n{"timest']
    text = "\n".join(out) + draw(st.sampled_from(ends))
    for _ in range(0 if plain else draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(INSERTS)) + text[at:]
    return text


@settings(max_examples=400, deadline=None)
@given(text=jsonl_texts(), chunk_chars=st.integers(1, 300))
# A key broken over two lines: joined with a bare comma, the whole-file reader took the two
# lines for one record.
@example(text=lines(ROW)[:-2] + ', "\nchat_id": 0}\n' + lines(ROW), chunk_chars=1)
def test_fuzzed_files_agree(text, chunk_chars):
    assert_agree(text, chunk_chars)


def test_scan_reads_a_large_mooncake_file_like_the_benchmark():
    rng = np.random.default_rng(0)
    inputs = rng.integers(1, 8000, 20_000)
    records = [
        {
            "timestamp": int(t),
            "input_length": int(i),
            "output_length": int(i) % 997 + 1,
            "hash_ids": list(range(int(i) // 512 + 1)),
        }
        for t, i in zip(np.cumsum(rng.integers(0, 50, len(inputs))), inputs, strict=True)
    ]
    text = lines(*records)
    scanned = _read_jsonl_scanned("t.jsonl", text, *READS[0])
    assert scanned is not None
    assert values(scanned) == outcome(_read_jsonl_rows, text, *READS[0])
    table, flat = scanned
    ids, offsets = flat["hash_ids"]
    assert len(table) == len(records) and offsets[-1] == len(ids)
    assert ids[offsets[7] : offsets[8]].tolist() == records[7]["hash_ids"]
