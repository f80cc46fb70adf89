"""Tests of steps/tokenize/csv_records.py: CSV framing that agrees with pyarrow's parser and cuts out what
it would swallow."""

from __future__ import annotations

import io
import random

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from steps.tokenize import csv_records as cr


def parse(data: bytes, names: list[str] | None = None) -> tuple[list, list[str]]:
    """Rows and malformed rows as pyarrow reads data (with a header unless names are given)."""
    malformed: list[str] = []

    def skip(row: object) -> str:
        malformed.append(row.text)
        return "skip"

    table = pacsv.read_csv(io.BytesIO(data), pacsv.ReadOptions(column_names=names),
                           pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=skip),
                           pacsv.ConvertOptions(column_types=dict.fromkeys("xyz", pa.binary())))
    return [tuple(row.values()) for row in table.to_pylist()], malformed


def blocks(data: bytes, max_record: int = 1 << 20, read: int = 7) -> list:
    stream = io.BytesIO(data)
    return list(cr.RecordBlocks(lambda _: stream.read(read), max_record, "f.csv"))


def random_csv(rng: random.Random) -> bytes:
    pieces = [b"a", b"b", b",", b'"', b'"', b'""', b"\n", b"\r\n", b"\r", b" "]
    return b"x,y,z\n" + b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 60)))


def test_blocks_parse_like_the_whole_file_and_cut_only_an_unclosed_quote(monkeypatch: pytest.MonkeyPatch) -> None:
    """On random bytes of quotes, commas and line breaks, read in pieces of a few bytes: the blocks' rows equal the
    rows of the whole file, unless a quote is left open (still open at the end, or closed in the middle of a value
    after a line break): then only that is cut out, with each of its lines counted."""
    monkeypatch.setattr(cr, "READ_BYTES", 5)
    rng = random.Random(3)
    checked = cut = 0
    for _ in range(600):
        data = random_csv(rng)
        try:
            want = parse(data)
        except pa.ArrowInvalid:  # e.g. a header that pyarrow refuses
            continue
        got = blocks(data, read=rng.randint(1, 9))
        rows, malformed = [], []
        for block in got:
            if block.data:
                r, m = parse(block.data, None if block.line == 1 else ["x", "y", "z"])
                rows += r
                malformed += m
        found = cr.scan(data)
        if found.in_quote or found.strays(data):
            cut += 1
            assert sum(b.dropped.get("unclosed_quote", 0) for b in got) >= 1
            assert set(rows) <= set(want[0])
            assert sum(b.dropped["unclosed_quote"] for b in got if b.dropped) + len(rows) + len(malformed) \
                >= len(want[0]) + len(want[1]) - 1  # never fewer rows in than pyarrow's records (header aside)
        else:
            checked += 1
            assert (rows, malformed) == want, data
            assert not any(b.dropped for b in got)
    assert checked > 200 and cut > 200, (checked, cut)


def test_with_a_small_record_limit_what_is_kept_is_whole_records_read_as_in_the_file(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cr, "READ_BYTES", 5)
    rng = random.Random(4)
    cut = 0
    for _ in range(300):
        data, limit = random_csv(rng), rng.randint(6, 20)
        try:
            want = parse(data)
            got = blocks(data, max_record=limit)
        except (pa.ArrowInvalid, ValueError):  # a header pyarrow refuses, or one cut out
            continue
        cut += any(b.dropped for b in got)
        for block in got:
            ends = [0, *cr.scan(block.data).record_ends(block.data).tolist(), len(block.data)]
            assert max(b - a for a, b in zip(ends, ends[1:], strict=False)) <= limit + 2
            if block.data and block.line != 1:
                assert set(parse(block.data, list("xyz"))[0]) <= set(want[0])
    assert cut > 100


def test_unclosed_quote_counts_its_lines_and_names_the_line_it_opened() -> None:
    data = (b'x,y,z\r\n1,a,b\r\n2,"multi\r\nline",ok\r\n'  # lines 1-4: header, a row, a two-line row
            b'3,"two\nlines","never closed\r\n4,c,d\r\n5,e,f')  # line 5 opens a row; line 6 a quote; 3 more
    got = blocks(data)
    assert [(b.dropped, b.notes) for b in got if b.dropped] == [(
        {"unclosed_quote": 4},
        {"unclosed_quote": "f.csv line 6: a quote opened here never closes (4 lines to the end of the file are one "
                           "field)"})]
    rows = [r for b in got if b.data for r in parse(b.data, None if b.line == 1 else list("xyz"))[0]]
    assert rows == [(b"1", b"a", b"b"), (b"2", b"multi\r\nline", b"ok")]


def test_a_quote_closed_by_the_next_rows_quotes_is_cut_out() -> None:
    """Every field quoted, one quote left open: it closes at the next row's first quote and the two rows would
    parse as one valid row; both lines are cut out instead."""
    rows = [b'%d,"title %d","text %d"' % (i, i, i) for i in range(6)]
    rows[2] = b'2,"title never closed,text 2'
    got = blocks(b"x,y,z\n" + b"\n".join(rows) + b"\n", read=1000)
    assert parse(b"x,y,z\n" + b"\n".join(rows) + b"\n")[0][2] == (  # pyarrow: one valid row, row 3 swallowed
        b"2", b'title never closed,text 2\n3,title 3"', b"text 3")
    assert [(b.dropped, b.notes) for b in got if b.dropped] == [(
        {"unclosed_quote": 2},
        {"unclosed_quote": "f.csv line 4: a quoted field opens here, runs over 2 lines and closes in the middle "
                           "of a value (a quote left open?)"})]
    rows_read = [r for b in got if b.data for r in parse(b.data, None if b.line == 1 else list("xyz"))[0]]
    assert [r[0] for r in rows_read] == [b"0", b"1", b"4", b"5"]
    multi_line = b'x,y,z\n1,"a\nb","c"\n2,"d""\n""e",f\n'  # legitimate fields over two lines: kept
    assert not blocks(multi_line)[-1].dropped and not cr.scan(multi_line).strays(multi_line)


def test_oversized_records_are_cut_out_and_the_rest_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cr, "READ_BYTES", 16)
    long = b"y" * 100
    data = (b"x,y,z\n1,a,b\n" + b'2,"' + long + b'\n' + long + b'",c\n'  # line 3: a quoted record of two lines
            + b"3,d,e\n4," + long + b",f\r\n5,g,h\n6," + long)  # line 6: unquoted; line 8: the last, no line end
    got = blocks(data, max_record=64, read=16)
    assert sum(b.dropped.get("oversized_row", 0) for b in got) == 3
    assert next(b.notes["oversized_row"] for b in got if b.notes) == "f.csv line 3: a record of more than 64 bytes"
    rows = [r for b in got if b.data for r in parse(b.data, None if b.line == 1 else list("xyz"))[0]]
    assert rows == [(b"1", b"a", b"b"), (b"3", b"d", b"e"), (b"5", b"g", b"h")]
    assert [b.line for b in got if b.data][-1] == 7  # line numbers stay right after a cut


def test_bom_header_and_header_problems() -> None:
    got = blocks(b'\xef\xbb\xbf"x",y,z\n1,"a\nb",c\n', read=100)
    assert got[0].data.startswith(b'"x"') and parse(got[0].data)[0] == [(b"1", b"a\nb", b"c")]
    with pytest.raises(ValueError, match="header"):
        blocks(b'"x,y,z\n1,a,b\n')
    with pytest.raises(ValueError, match="header"):
        blocks(b"x" * 100 + b"\n1,a,b\n", max_record=64, read=16)
    with pytest.raises(ValueError, match="header"):
        blocks(b"x,\xff,z\n1,a,b\n")


def test_scan_matches_pyarrow_quoting_rules() -> None:
    """A quote opens a field only at its start; a doubled quote inside is literal; a lone one closes."""
    assert not cr.scan(b'1,5" screen,a\n').in_quote  # mid-field quote: literal
    assert cr.scan(b'1,"5"" screen,a\n').in_quote  # doubled quote inside: still open
    assert not cr.scan(b'1,"a"b,"c"\n').in_quote  # text after a closing quote: pyarrow keeps reading the field
    assert cr.scan(b'1,"a\n').opened == 2 and cr.scan(b'"a",b\n"c').opened == 6
    assert not cr.scan(b'still open",b\n', in_quote=True).in_quote and cr.scan(b"a,b", in_quote=True).in_quote
    assert cr.breaks(b"a\r\nb\rc\nd") == 3
