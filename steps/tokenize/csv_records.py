"""CSV framing for the tokenize step: cut a CSV byte stream into blocks of whole records.

Written by hand because no library does this part: pyarrow's CSV reader (which parses every block here) fails the
whole file on invalid UTF-8 and, with `newlines_in_values`, reads an unclosed quote as one field to the end of the
file without naming a line, and its `invalid_row_handler` sees neither case; Python's `csv` module names the line but
parses 8.5 times slower than pyarrow on one thread (measured here on 2026-12-07: 200,000 review-like rows, 94 MB,
0.62 s against 0.073 s), a cost at Amazon Polarity's 3.6M rows; `datasets` loads CSV through pandas, which refuses
the file or its rows without counting them.

The parser (pyarrow) then reads each block on its own, so no record straddles blocks, and what it would silently
swallow or refuse is cut out here, counted, and said where (in physical lines, since a record of several lines
that should have been one may hold several rows):
  unclosed_quote    a quote left open: one still open at the end of the file (every line from its record to the
                    end would be one field), or a quoted field that spans lines and is closed by a quote in the
                    middle of a value (most likely by the quotes of the rows it swallowed)
  oversized_row     a record longer than max_record bytes (one row, whatever lines it spans)
  invalid_encoding  a record that is not valid UTF-8 (pyarrow would refuse the whole file)

Quoting follows pyarrow's parser (delimiter ",", quote '"', doubled quotes inside quoted fields, no escape
character): a quote opens a quoted field only at the start of a field; inside one, a doubled quote is a literal
quote and a single one closes it; line breaks inside quoted fields belong to the field. Records end at LF, CRLF or
a lone CR. The scan is vectorized with numpy: only odd runs of quotes change the state; such a run toggles it at
the start of a field (opens a field, or closes an open one), and anywhere else closes an open field. Memory stays
at about two reads plus one record; a leading UTF-8 BOM is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

QUOTE, COMMA, LF, CR = 34, 44, 10, 13
BOM = b"\xef\xbb\xbf"
READ_BYTES = 4 << 20
FIELD_EDGE = np.zeros(256, bool)  # a quote right after one of these starts a field, one right before ends it
FIELD_EDGE[[COMMA, LF, CR]] = True


@dataclass
class Block:
    """Whole records (the file's header is the first record of the first block), and what was cut out in or
    before them."""

    data: bytes
    anchors: list[tuple[int, int]]  # (offset in data, its line number): the start, and after each cut
    dropped: dict[str, int] = field(default_factory=dict)  # rows cut out, by reason
    notes: dict[str, str] = field(default_factory=dict)  # reason -> where and what, for the first cut of each

    @property
    def line(self) -> int:
        """Line number (1-based) of the first byte of data."""
        return self.anchors[0][1] if self.anchors else 0

    def line_at(self, offset: int) -> int:
        """Line number of data[offset]."""
        start, line = max(a for a in self.anchors if a[0] <= offset)
        return line + breaks(self.data, start, offset)


def breaks(buf: bytes, start: int = 0, end: int | None = None) -> int:
    """Line breaks (LF, CRLF or a lone CR) in buf[start:end]."""
    a = np.frombuffer(buf, np.uint8)[start:end]
    n = int(np.count_nonzero(a == LF))
    if buf.find(b"\r", start, end) >= 0:
        n += int(np.count_nonzero(a == CR) - np.count_nonzero((a[:-1] == CR) & (a[1:] == LF)))
    return n


def line_ends(buf: bytes) -> np.ndarray:
    """Offsets of the line breaks of buf (an LF, or a lone CR)."""
    a = np.frombuffer(buf, np.uint8)
    lines = np.flatnonzero(a == LF)
    if b"\r" in buf:
        cr = np.flatnonzero(a == CR)
        lines = np.union1d(lines, cr[(a[np.minimum(cr + 1, len(a) - 1)] != LF) | (cr == len(a) - 1)])
    return lines


@dataclass
class Scan:
    """The quoting state through a buffer: it changes only at events (the first quote of each odd run of quotes)."""

    events: np.ndarray
    runs: np.ndarray  # length of each event's run of quotes
    after: np.ndarray  # state after each event: True inside a quoted field
    start: bool  # state at the first byte

    @property
    def in_quote(self) -> bool:
        """The state after the last byte."""
        return bool(self.after[-1]) if len(self.events) else self.start

    def _opens(self) -> np.ndarray:
        return self.after & ~np.append(self.start, self.after[:-1])

    @property
    def opened(self) -> int:
        """Offset of the quote that opened the field still open at the end; -1 if none, or not in this buffer."""
        opens = np.flatnonzero(self._opens())
        return int(self.events[opens[-1]]) if self.in_quote and len(opens) else -1

    def quoted(self, at: np.ndarray) -> np.ndarray:
        """The state at each offset."""
        if not len(self.events):
            return np.full(len(at), self.start)
        k = np.searchsorted(self.events, at) - 1
        return np.where(k >= 0, self.after[np.maximum(k, 0)], self.start)

    def record_ends(self, buf: bytes) -> np.ndarray:
        """Offsets just after each record end (a line break outside quoted fields)."""
        lines = line_ends(buf)
        return lines[~self.quoted(lines)] + 1

    def last_record_end(self, buf: bytes) -> int:
        """Offset just after the last record end, -1 if none (the last line break is tried first)."""
        near = max(buf.rfind(b"\n"), buf.rfind(b"\r") if b"\r" in buf else -1)
        if near < 0 or not self.quoted(np.array([near]))[0]:
            return near + 1 if near >= 0 else -1
        ends = self.record_ends(buf)
        return int(ends[-1]) if len(ends) else -1

    def first_record_end(self, buf: bytes, start: int) -> int:
        """Offset just after the first record end at or after start, -1 if none (the first line break there is
        tried first)."""
        near = [i for i in (buf.find(b"\n", start), buf.find(b"\r", start) if b"\r" in buf else -1) if i >= 0]
        if not near:
            return -1
        if not self.quoted(np.array([min(near)]))[0]:
            return min(near) + 1 + (buf[min(near):min(near) + 2] == b"\r\n")
        ends = self.record_ends(buf)
        ends = ends[ends > start]
        return int(ends[0]) if len(ends) else -1

    def strays(self, buf: bytes) -> list[tuple[int, int]]:
        """(opening, closing) offsets of the quoted fields that span a line break and are closed by a quote in the
        middle of a value rather than at the end of the field."""
        if not len(self.events):
            return []
        closes = ~self.after & np.append(self.start, self.after[:-1])
        after_run = self.events + self.runs
        inside = after_run < len(buf)
        odd = closes & inside
        odd[odd] = ~FIELD_EDGE[np.frombuffer(buf, np.uint8)[after_run[odd]]]
        if not odd.any():
            return []
        last_open = np.maximum.accumulate(np.where(self._opens(), np.arange(len(self.events)), -1))
        found = []
        for i in np.flatnonzero(odd):
            start = int(self.events[last_open[i]]) if last_open[i] >= 0 else 0
            end = int(after_run[i])
            if buf.find(b"\n", start, end) >= 0 or buf.find(b"\r", start, end) >= 0:
                found.append((start, end))
        return found


def scan(buf: bytes, in_quote: bool = False, prev: int = LF) -> Scan:
    """The quoting state through buf, which starts inside a quoted field if in_quote, `prev` being the byte
    before it."""
    none = Scan(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, bool), in_quote)
    if b'"' not in buf:
        return none
    a = np.frombuffer(buf, np.uint8)
    quotes = np.flatnonzero(a == QUOTE)
    run_start = np.ones(len(quotes), bool)
    run_start[1:] = np.diff(quotes) != 1
    first = np.flatnonzero(run_start)
    runs = np.diff(np.append(first, len(quotes)))
    odd = runs % 2 == 1
    events, runs = quotes[first[odd]], runs[odd]
    if not len(events):
        return none
    toggles = FIELD_EDGE[a[events - 1]]  # for events[0] == 0 this reads the last byte: replaced next
    toggles[0] = FIELD_EDGE[a[events[0] - 1] if events[0] else prev]
    last_close = np.maximum.accumulate(np.where(toggles, -1, np.arange(len(events))))
    count = np.cumsum(toggles)
    since = count - np.where(last_close >= 0, count[np.maximum(last_close, 0)], 0)
    return Scan(events, runs, np.where(last_close >= 0, False, in_quote) ^ (since % 2 == 1), in_quote)


class RecordBlocks:
    """A CSV byte stream as Blocks of whole records of at most max_record bytes each (about READ_BYTES a Block)."""

    def __init__(self, read: Callable[[int], bytes], max_record: int, where: str) -> None:
        self.read, self.max_record, self.where = read, max_record, where
        self.dropped: dict[str, int] = {}
        self.notes: dict[str, str] = {}

    def _cut(self, reason: str, rows: int, what: str, line: int, data: bytes = b"", at: int = 0,
             header: bool = False) -> None:
        """Count rows cut out (refuse to cut the header); the first of each reason is noted with its line: that of
        data[at], data starting at line."""
        if header:
            raise ValueError(f"its first record (line 1: the header, or the first row of a file without one) is "
                             f"unusable: {what}; save the file as UTF-8 CSV")
        self.dropped[reason] = self.dropped.get(reason, 0) + rows
        if reason not in self.notes:
            self.notes[reason] = f"{self.where} line {line + breaks(data, 0, at)}: {what}"

    def _reads(self) -> Iterator[tuple[bytes, bool]]:
        """(bytes, final) pieces of at most about max_record bytes (so a record that starts and ends in one is
        never too long), that never end inside a run of quotes or between CR and LF (that would change how they
        scan), unless the run itself is longer than a record may be."""
        held, first = b"", True
        while True:
            new = self.read(min(READ_BYTES, self.max_record))
            if first:
                new, first = new.removeprefix(BOM), False
            piece, held = held + new if held else new, b""
            if not new:
                yield piece, True
                return
            keep = 0
            while keep < len(piece) and piece[-1 - keep] in (QUOTE, CR):
                keep += 1
            if keep == len(piece) and len(piece) <= self.max_record:
                held = piece
            elif 0 < keep < len(piece):
                yield piece[:len(piece) - keep], False
                held = piece[len(piece) - keep:]
            else:
                yield piece, False

    def __iter__(self) -> Iterator[Block]:
        record, line = b"", 1  # bytes of the unfinished record, and its first line
        skip = None  # while dropping an oversized record: (quoting state, byte before, lines so far)
        kept: list[tuple[bytes, int]] = []  # (whole records, first line) for the next Block
        size = 0
        too_long = f"a record of more than {self.max_record} bytes"
        for piece, final in self._reads():
            if skip is not None:  # find the end of the oversized record, keep nothing of it
                found = scan(piece, skip[0], skip[1])
                end = found.first_record_end(piece, 0)
                if end < 0:
                    skip = (found.in_quote, piece[-1] if piece else skip[1], skip[2] + breaks(piece))
                    if final:
                        self._end_oversized(found.in_quote, line, skip[2], skip[1])
                    continue
                self._cut("oversized_row", 1, too_long, line, header=line == 1)
                line += skip[2] + breaks(piece, 0, end)
                piece, skip = piece[end:], None
            buf = record + piece if record else piece
            found = scan(buf)
            if record:  # the record carried over: too long once it ends?
                end = found.first_record_end(buf, len(record))
                end = len(buf) if end < 0 and final and not found.in_quote else end
                if end > self.max_record:
                    self._cut("oversized_row", 1, too_long, line, header=line == 1)
                    line += breaks(buf, 0, end)
                    buf = buf[end:]
                    found = scan(buf)
            end = len(buf) if final and not found.in_quote else found.last_record_end(buf)
            if end > 0:
                for data, at in self._checked(buf[:end], found, line):
                    kept.append((data, at))
                    size += len(data)
                line += breaks(buf, 0, end)
            record = buf[max(end, 0):]
            if final and record:  # still in a quoted field at the end: its lines may be swallowed rows
                rows = breaks(record) + (record[-1] not in (LF, CR))
                self._cut("unclosed_quote", rows, f"a quote opened here never closes ({rows} lines to the end "
                          "of the file are one field)", line, record, found.opened - max(end, 0), line == 1)
            elif len(record) > self.max_record:
                skip, record = (found.in_quote, buf[-1], breaks(record)), b""
            if kept and (size >= READ_BYTES or final):
                yield self._block(kept)
                kept, size = [], 0
        if self.dropped or kept:
            yield self._block(kept)

    def _block(self, kept: list[tuple[bytes, int]]) -> Block:
        anchors, offset = [], 0
        for data, line in kept:
            anchors.append((offset, line))
            offset += len(data)
        block = Block(b"".join(data for data, _ in kept), anchors, self.dropped, self.notes)
        self.dropped, self.notes = {}, {}
        return block

    def _end_oversized(self, in_quote: bool, line: int, lines: int, last: int) -> None:
        if in_quote:
            rows = lines + (last not in (LF, CR))
            self._cut("unclosed_quote", rows, f"a quote in the record from here never closes ({rows} lines to the "
                      "end of the file are one field)", line, header=line == 1)
        else:
            self._cut("oversized_row", 1, f"a record of more than {self.max_record} bytes", line, header=line == 1)

    def _checked(self, data: bytes, found: Scan, line: int) -> list[tuple[bytes, int]]:
        """data (whole records from line on) as (bytes, first line) parts, without the records that hold a quoted
        field closed astray (see Scan.strays) or that are not valid UTF-8."""
        cuts: list[tuple[int, int]] = []
        strays = found.strays(data)
        try:
            data.decode()
        except UnicodeDecodeError:
            strays.append((-1, -1))
        if not strays:
            return [(data, line)]
        ends = found.record_ends(data)
        ends = np.append(0, ends if len(ends) and ends[-1] == len(data) else np.append(ends, len(data)))
        for opened, closed in strays:
            if opened < 0:
                continue
            start, stop = int(ends[ends <= opened][-1]), int(ends[ends >= closed][0])
            if cuts and start < cuts[-1][1]:
                continue
            rows = breaks(data, start, stop) + (data[stop - 1] not in (LF, CR))
            self._cut("unclosed_quote", rows, f"a quoted field opens here, runs over {rows} lines and closes in "
                      "the middle of a value (a quote left open?)", line, data, opened, line == 1 and start == 0)
            cuts.append((start, stop))
        if strays[-1][0] < 0:
            for start, stop in zip(ends[:-1].tolist(), ends[1:].tolist(), strict=True):
                if any(a <= start < b for a, b in cuts):
                    continue
                try:
                    data[start:stop].decode()
                except UnicodeDecodeError:
                    self._cut("invalid_encoding", 1, "not valid UTF-8", line, data, start, line == 1 and start == 0)
                    cuts.append((start, stop))
        parts, start = [], 0
        for a, b in [*sorted(cuts), (len(data), len(data))]:
            if a > start:
                parts.append((data[start:a], line))
            line += breaks(data, start, b)
            start = b
        return parts
