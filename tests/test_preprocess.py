"""Tests of steps/tokenize/preprocess.py: sources, validation and drop counts, tokenization rule, stats, CLI."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fixtures_ml import build_tokenizer, step_arguments

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from steps.tokenize import csv_records
from steps.tokenize import preprocess as pre
from steps.tokenize import readers as rd
from steps.tokenize import reviews as rev


def drops(**counts: int) -> dict[str, int]:
    """stats.json's "dropped" of a split: every reason, zero unless given."""
    assert set(counts) <= set(rd.DROP_REASONS)
    return dict.fromkeys(rd.DROP_REASONS, 0) | counts


def adds_up(stats: dict) -> None:
    """Rows in = rows out + drops, for each split, and the rows out are the rows written."""
    for split, info in stats["input"].items():
        assert info["rows_in"] == info["rows_out"] + sum(info["dropped"].values()), split
        assert info["dropped_total"] == sum(info["dropped"].values())
    out = stats["output"]
    assert out["train"]["rows"] + out["validation"]["rows"] == stats["input"]["train"]["rows_out"]
    assert out["test"]["rows"] == stats["input"]["test"]["rows_out"]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def run(tok_dir: Path, source: str | Path, out: Path, *extra: str) -> dict:
    """Run the step in-process; return stats.json."""
    argv = [*step_arguments("Tokenize"), "--source", str(source), "--model-id", str(tok_dir), "--max-length", "32",
            "--validation-share", "0.2", "--seed", "7", "--output-dir", str(out), *extra]
    assert pre.main(argv) == 0
    return json.loads((out / "stats" / "stats.json").read_text())


def read(out: Path, split: str) -> pa.Table:
    files = sorted((out / split).glob("part-*.parquet"))
    assert files, f"no shards in {out / split}"
    return pa.concat_tables(pq.read_table(f) for f in files)


def good_rows(n: int, start: int = 0) -> list[dict]:
    return [{"label": i % 2, "title": f"title {i}", "content": f"the sound quality is great {i}"}
            for i in range(start, start + n)]


def test_sample_is_deterministic_balanced_and_follows_schema(tok_dir: Path, tmp_path: Path) -> None:
    a = run(tok_dir, "sample:300", tmp_path / "a")
    run(tok_dir, "sample:300", tmp_path / "b")
    run(tok_dir, "sample:300", tmp_path / "c", "--seed", "8")
    for split in pre.SPLITS:
        shard = f"{split}/part-00000.parquet"
        assert (tmp_path / "a" / shard).read_bytes() == (tmp_path / "b" / shard).read_bytes()
    test_a, test_c = (tmp_path / d / "test" / "part-00000.parquet" for d in "ac")
    assert test_a.read_bytes() != test_c.read_bytes()

    out = a["output"]
    assert a["input"]["train"]["rows_in"] == 300 and a["input"]["test"]["rows_in"] == 30
    assert out["train"]["rows"] + out["validation"]["rows"] == 300
    assert a["labels"] == ["negative", "positive"]  # data.labels of the shipped config
    # stratified: each class gives exactly the share (0.2) of its 150 rows to validation
    assert out["validation"]["labels"] == {"negative": 30, "positive": 30}
    assert out["train"]["labels"] == {"negative": 120, "positive": 120}
    assert out["test"]["labels"] == {"negative": 15, "positive": 15}
    table = read(tmp_path / "a", "train")
    assert table.schema.remove_metadata() == pre.SCHEMA
    assert json.loads(table.schema.metadata[b"labels"]) == ["negative", "positive"]  # what train.py names them by
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert table.schema.field("token_type_ids").type == pa.list_(pa.int8())
    lengths = table["length"].to_numpy()
    assert np.array_equal(lengths, [len(x) for x in table["input_ids"].to_pylist()])
    assert lengths.max() == 32 and lengths.min() < 32  # no padding: rows of their own length, truncated to max_length


def test_sample_text_is_varied_with_negations_and_mixed_reviews() -> None:
    reviews = [t for _, t in (rev.synthetic_review(random.Random(i), i % 2) for i in range(400))]
    assert len(set(reviews)) == 400
    assert sum(" not " in r or "never" in r or "no complaints" in r for r in reviews) > 100
    assert sum(r.startswith("But") or " But " in r or "However" in r for r in reviews) > 20
    words = [len(r.split()) for r in reviews]
    assert min(words) < 10 and max(words) > 150


def test_stats_percentiles_and_truncation_match_output(tok_dir: Path, tmp_path: Path) -> None:
    stats = run(tok_dir, "sample:400", tmp_path)
    for split in pre.SPLITS:
        lengths = read(tmp_path, split)["length"].to_numpy()
        got = stats["output"][split]["token_length"]
        for q in (50, 90, 95, 99):
            assert got[f"p{q}"] == int(np.percentile(lengths, q, method="inverted_cdf")), (split, q)
        assert got["max"] == lengths.max()
        assert stats["output"][split]["truncated"] <= int((lengths == 32).sum())
    assert stats["output"]["train"]["truncated"] > 0
    assert stats["seconds"] > 0


def test_tokenization_rule(tok_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setattr(rd, "CHUNK_ROWS", 2)  # several chunks: token types derived after the first check
    tok = AutoTokenizer.from_pretrained(str(tok_dir), use_fast=True)
    long_content = " ".join(["great sound"] * 40)
    long_title = " ".join(["battery life"] * 40)
    rows = [
        {"label": 1, "title": "love it", "content": "the sound quality is great"},
        {"label": 0, "title": "disappointed", "content": long_content},  # content cut, title kept
        {"label": 1, "title": "  ", "content": "five stars"},  # no title: single sequence
        {"label": 0, "title": long_title, "content": "waste of money"},  # title leaves no room: both cut
        {"label": 1, "title": "great [SEP] sound", "content": "the [SEP] lid"},  # literal [SEP]s in the text
    ]
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), data / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows), data / "test.parquet")
    run(tok_dir, data, tmp_path / "out", "--validation-share", "0")
    got = read(tmp_path / "out", "test").to_pylist()

    def expect(*texts: str, strategy: str) -> dict:
        return tok(*texts, truncation=strategy, max_length=32, return_token_type_ids=True)

    cases = [expect("love it", "the sound quality is great", strategy="only_second"),
             expect("disappointed", long_content, strategy="only_second"),
             expect("five stars", strategy="longest_first"),
             expect(long_title, "waste of money", strategy="longest_first"),
             expect("great [SEP] sound", "the [SEP] lid", strategy="only_second")]
    for row, want, src in zip(got, cases, rows, strict=True):
        assert row["input_ids"] == want["input_ids"]
        assert row["token_type_ids"] == want["token_type_ids"]
        assert row["label"] == src["label"] and row["length"] == len(want["input_ids"])
    assert tok.decode(got[1]["input_ids"]).split("[SEP]")[0].strip().endswith("disappointed")
    assert set(got[2]["token_type_ids"]) == {0}
    assert got[4]["input_ids"].count(tok.sep_token_id) == 4  # the [SEP]s of the text are special tokens too
    assert len(read(tmp_path / "out", "validation")) == 0  # share 0: an empty shard with the schema
    # the test split keeps each row's original text beside its tokens (what the endpoint test sends); no other does
    assert [(row["title"], row["content"]) for row in got] == [
        (src["title"] if src["title"].strip() else None, src["content"]) for src in rows]
    assert read(tmp_path / "out", "test").schema == pre.TEST_SCHEMA
    assert read(tmp_path / "out", "train").schema == pre.SCHEMA


def write_csv(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("label,title,content\n" + "\n".join(lines) + "\n")


def test_csv_bad_rows_are_dropped_and_counted(tok_dir: Path, tmp_path: Path) -> None:
    good = [f'{i % 2},"title {i}","the sound is great {i}"' for i in range(20)]
    bad = [
        '2,"t","label out of range"',
        'abc,"t","unparsable label"',
        ',"t","missing label"',
        '-1,"t","negative label"',
        '1,"t",',  # content missing (unquoted empty field)
        '0,"","   "',  # title and content empty
        '1,,""',  # no title, empty content
        '1,"t","too","many","fields"',  # malformed
    ]
    write_csv(tmp_path / "in" / "train" / "part1.csv", good[:10] + bad[:4])
    write_csv(tmp_path / "in" / "train" / "part2.csv", good[10:] + bad[4:])
    write_csv(tmp_path / "in" / "test" / "data.csv", good[:5] + ['1,"only a title",""'])
    stats = run(tok_dir, tmp_path / "in", tmp_path / "out", "--max-bad-share", "0.5")
    train = stats["input"]["train"]
    assert train["dropped"] == drops(malformed_row=1, invalid_label=4, missing_content=1, empty_text=2)
    assert train["rows_in"] == 28 and train["rows_out"] == 20 and train["dropped_total"] == 8
    part1, part2 = tmp_path / "in" / "train" / "part1.csv", tmp_path / "in" / "train" / "part2.csv"
    assert train["notes"] == {
        "malformed_row": f"{part2} line 15: wrong number of fields (3 in the header)",
        "invalid_label": f"{part1} row 11 of a chunk: label '2' is not one of negative, positive",
        "missing_content": f"{part2} row 11 of a chunk: no content (the column is empty)",
        "empty_text": f"{part2} row 12 of a chunk: neither a title nor content"}
    assert stats["output"]["train"]["rows"] + stats["output"]["validation"]["rows"] == 20
    test = stats["input"]["test"]
    assert test["rows_out"] == 6 and test["dropped_total"] == 0  # a title alone is enough text
    assert stats["output"]["test"]["rows"] == 6


def test_jsonl_and_parquet_bad_rows(tok_dir: Path, tmp_path: Path) -> None:
    lines = [json.dumps(r) for r in good_rows(12)]
    lines += [
        json.dumps({"label": "positive", "title": "t", "content": "label as a name"}),  # kept
        json.dumps({"label": 1.0, "title": "t", "content": "float label"}),  # kept
        json.dumps({"label": None, "title": "t", "content": "null label"}),
        json.dumps({"label": 3, "title": "t", "content": "label 3"}),
        json.dumps({"label": 1, "title": "t", "content": None}),
        json.dumps({"label": 1, "title": "t"}),  # no content key
        json.dumps({"label": 0, "title": None, "content": ""}),
        "{not json",
        "[1, 2]",
    ]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train.jsonl").write_text("\n".join(lines) + "\n")
    test = pa.table({"label": pa.array([0, 1, 2, 1, 0], pa.int64()),
                     "title": ["a", None, "c", "d", ""],
                     "content": ["the sound", "great", "bad label", None, " "]})
    pq.write_table(test, tmp_path / "in" / "test.parquet")
    stats = run(tok_dir, tmp_path / "in", tmp_path / "out", "--max-bad-share", "1")
    assert stats["input"]["train"]["dropped"] == drops(malformed_row=2, invalid_label=2, missing_content=2,
                                                       empty_text=1)
    assert stats["input"]["train"]["rows_out"] == 14
    assert stats["input"]["test"]["dropped"] == drops(invalid_label=1, missing_content=1, empty_text=1)
    assert read(tmp_path / "out", "test")["label"].to_pylist() == [0, 1]


def test_max_rows_per_split_caps_every_split(tok_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stats = run(tok_dir, "sample:500", tmp_path / "sample", "--max-rows-per-split", "40")  # 500 train, 50 test
    assert stats["input"]["train"]["rows_in"] == 40 and stats["input"]["test"]["rows_in"] == 40
    assert stats["output"]["test"]["rows"] == 40 and len(read(tmp_path / "sample", "test")) == 40
    adds_up(stats)

    # files, with rows dropped while reading (they count towards the cap) and several chunks per file
    monkeypatch.setattr(rd, "CHUNK_ROWS", 8)
    folder = tmp_path / "in"
    write_csv(folder / "train" / "a.csv", [f'{i % 2},"t","fine {i}"' for i in range(30)] + ['1,"x","y","z"'] * 5)
    write_csv(folder / "train" / "b.csv", [f'{i % 2},"t","fine {i}"' for i in range(30)])
    lines = [json.dumps(r) for r in good_rows(10)] + ["{broken"] * 3 + [json.dumps(r) for r in good_rows(40)]
    (folder / "test.jsonl").write_text("\n".join(lines) + "\n")
    stats = run(tok_dir, folder, tmp_path / "files", "--max-rows-per-split", "45", "--max-bad-share", "0.2")
    train, test = stats["input"]["train"], stats["input"]["test"]
    assert train["rows_in"] == 45 and train["dropped"] == drops(malformed_row=5) and train["rows_out"] == 40
    assert test["rows_in"] == 45 and test["dropped"] == drops(malformed_row=3) and test["rows_out"] == 42
    adds_up(stats)


def test_validation_split_is_stratified_seeded_and_chunk_independent() -> None:
    labels = np.random.default_rng(0).choice(3, size=50_000, p=[0.6, 0.3, 0.1]).astype(np.int32)
    whole = pre.validation_mask(labels, np.zeros(3, np.int64), 0.05, 42)
    for c in range(3):  # each class gives the share of its rows, to one row
        assert abs(whole[labels == c].sum() - 0.05 * (labels == c).sum()) <= 1
    seen = np.zeros(3, np.int64)
    pieces = [pre.validation_mask(labels[a:b], seen, 0.05, 42) for a, b in ((0, 1234), (1234, 30_000), (30_000, None))]
    assert np.array_equal(np.concatenate(pieces), whole) and seen.tolist() == np.bincount(labels).tolist()
    assert not np.array_equal(whole, pre.validation_mask(labels, np.zeros(3, np.int64), 0.05, 43))
    gaps = np.diff(np.flatnonzero(whole[labels == 0]))  # spread evenly over the input: every 20th row of a class
    assert set(gaps.tolist()) <= {19, 20, 21}


def test_bad_input_errors_name_the_file(tok_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "in"
    write_csv(folder / "train.csv", ['1,"t","fine"'])
    (folder / "test.csv").write_text("stars,body\n1,hello\n")
    argv = [*step_arguments("Tokenize"),
            "--source", str(folder), "--model-id", str(tok_dir), "--output-dir", str(tmp_path / "out")]
    assert pre.main(argv) == 1
    err = capsys.readouterr().err
    assert "test.csv" in err and "label column" in err

    (folder / "test.csv").unlink()
    (folder / "test.parquet").write_bytes(b"this is not parquet")
    assert pre.main(argv) == 1
    err = capsys.readouterr().err
    assert "cannot read" in err and "test.parquet" in err

    (folder / "test.parquet").unlink()
    assert pre.main(argv) == 1
    assert "no test files" in capsys.readouterr().err


def test_a_max_length_over_the_models_limit_is_refused(tok_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    argv = [*step_arguments("Tokenize"), "--source", "sample:20", "--model-id", str(tok_dir), "--max-length", "1024",
            "--output-dir", str(tmp_path / "out")]
    assert pre.main(argv) == 1
    assert "--max-length 1024 exceeds the model's limit 512" in capsys.readouterr().err


def test_the_original_csv_release_reads_without_a_header_and_maps_its_polarity(tok_dir: Path, tmp_path: Path) -> None:
    """train.csv / test.csv of the original release: no header, polarity 1 = negative, 2 = positive."""
    rows = ['"2","Stuning even for the non-gamer","This sound track was beautiful!"',
            '"1","Buyer beware","This is a self-published book, and if you want to know why, read a few paragraphs"',
            '"2","","Great, ""really"" great\nand long"', '"3","odd","a polarity of three"']
    for header, folder in (([], tmp_path / "release"), (["polarity,title,text"], tmp_path / "named")):
        folder.mkdir()
        (folder / "train.csv").write_text("\n".join(header + rows) + "\n")
        (folder / "test.csv").write_text("\n".join(header + rows[:2]) + "\n")
        out = tmp_path / f"out-{folder.name}"
        stats = run(tok_dir, folder, out, "--max-bad-share", "1")
        assert stats["input"]["train"]["dropped"] == drops(invalid_label=1), folder.name
        assert stats["input"]["train"]["rows_in"] == 4
        test = read(out, "test")
        assert test["label"].to_pylist() == [1, 0], folder.name
        assert test["title"].to_pylist() == ["Stuning even for the non-gamer", "Buyer beware"]


def test_hidden_folders_and_unreadable_text_are_not_data(tok_dir: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    """Spark's _temporary/, Jupyter's .ipynb_checkpoints/ are skipped; a lone surrogate escape in a JSON line, a
    non-JSON-object array element and invalid UTF-8 in Parquet each drop their row (counted), not the file."""
    import gzip

    folder = tmp_path / "in"
    lines = [json.dumps(r) for r in good_rows(10)]
    lines.append('{"label": 1, "title": "emoji cut \\ud83d", "content": "fine"}')
    lines.append('{"label": 1, "title": "a whole emoji \\ud83d\\ude00", "content": "fine"}')
    (folder / "train").mkdir(parents=True)
    (folder / "train" / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    for hidden in ("_temporary/0/task_1", ".ipynb_checkpoints"):
        (folder / "train" / hidden).mkdir(parents=True)
        (folder / "train" / hidden / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "test.json").write_text(json.dumps([*good_rows(3), 5, None, ["a"]]))
    stats = run(tok_dir, folder, tmp_path / "out", "--max-bad-share", "1")
    assert stats["input"]["train"]["rows_in"] == 12 and stats["input"]["train"]["dropped"] == drops(
        invalid_encoding=1)
    assert stats["input"]["test"]["dropped"] == drops(malformed_row=3)

    (folder / "test.json").unlink()
    content = pa.array([b"the sound", b"caf\xe9 latin-1", b"great"], pa.binary())
    pq.write_table(pa.table({"label": [0, 1, 1], "title": ["a", "b", "c"], "content": content}),
                   folder / "test.parquet")
    stats = run(tok_dir, folder, tmp_path / "out2", "--max-bad-share", "1")
    assert stats["input"]["test"]["dropped"] == drops(invalid_encoding=1)
    assert read(tmp_path / "out2", "test")["content"].to_pylist() == ["the sound", "great"]

    (folder / "test.parquet").unlink()
    (folder / "test.jsonl.gz").write_bytes(gzip.compress("\n".join(lines).encode())[:60])  # a cut download
    argv = [*step_arguments("Tokenize"),
            "--source", str(folder), "--model-id", str(tok_dir), "--output-dir", str(tmp_path / "out3")]
    assert pre.main(argv) == 1
    assert "test.jsonl.gz: EOFError" in capsys.readouterr().err  # one line, no traceback


def test_cli_fails_when_too_many_rows_are_bad(tok_dir: Path, tmp_path: Path) -> None:
    rows = [f'{i % 2},"t","fine {i}"' for i in range(95)] + ['7,"t","x"'] * 5
    write_csv(tmp_path / "in" / "train.csv", rows)
    write_csv(tmp_path / "in" / "test.csv", ['1,"t","fine"'])
    cmd = [sys.executable, "-m", "steps.tokenize", *step_arguments("Tokenize"),
           "--source", str(tmp_path / "in"), "--model-id",
           str(tok_dir), "--max-length", "32", "--validation-share", "0.05", "--seed", "42",
           "--max-bad-share", "0.01", "--output-dir", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "train: 5 of 100 rows are bad" in proc.stderr and "invalid_label=5" in proc.stderr
    assert "--max-bad-share" in proc.stderr
    stats = json.loads((tmp_path / "out" / "stats" / "stats.json").read_text())
    assert stats["input"]["train"]["dropped"]["invalid_label"] == 5 and "error" in stats


def csv_rows(n: int) -> list[str]:
    return [f"{i % 2},title {i},the sound quality is great {i}" for i in range(n)]


def test_unclosed_quote_fails_naming_the_line_and_counts_the_swallowed_rows(tok_dir: Path, tmp_path: Path) -> None:
    """Row 3000 of 4000 (line 3001) opens a quote that never closes: the 1001 rows from there on are bad."""
    rows = csv_rows(4000)
    rows[2999] = '1,title 2999,"the quote of this review never closes'
    write_csv(tmp_path / "in" / "train.csv", rows)
    write_csv(tmp_path / "in" / "test.csv", csv_rows(10))
    cmd = [sys.executable, "-m", "steps.tokenize", *step_arguments("Tokenize"),
           "--source", str(tmp_path / "in"), "--model-id",
           str(tok_dir), "--max-length", "32", "--output-dir", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("preprocess failed: train: 1001 of 4000 rows are bad (25.02%: unclosed_quote=1001)")
    assert f"{tmp_path / 'in' / 'train.csv'} line 3001: a quote opened here never closes" in line

    stats = run(tok_dir, tmp_path / "in", tmp_path / "out", "--max-bad-share", "0.3")
    train = stats["input"]["train"]
    assert train["rows_in"] == 4000 and train["rows_out"] == 2999
    assert train["dropped"] == drops(unclosed_quote=1001)
    assert "line 3001" in train["notes"]["unclosed_quote"]
    adds_up(stats)


def quoted_rows(n: int) -> list[str]:
    return [f'{i % 2},"title {i}","the sound is great {i}"' for i in range(n)]


@pytest.mark.parametrize(("rows", "bad", "dropped", "note"), [
    # unquoted file: the quote swallows the rest of the file into a record of too few fields
    (csv_rows, '1,"title never closed,the content', 1001, "line 3001: a quote opened here never closes"),
    # every field quoted: the next row's first quote closes it; pyarrow would read the two lines as one valid row
    (quoted_rows, '1,"title never closed,the content', 2, "line 3001: a quoted field opens here, runs over 2 lines"),
    # ... or as one record of 4 fields
    (quoted_rows, '1,"title 2999","never closed', 2, "line 3001: a quoted field opens here, runs over 2 lines"),
])
def test_unclosed_quote_variants(tok_dir: Path, tmp_path: Path, rows: Callable, bad: str, dropped: int,
                                 note: str) -> None:
    lines = rows(4000)
    lines[2999] = bad
    write_csv(tmp_path / "in" / "train.csv", lines)
    write_csv(tmp_path / "in" / "test.csv", csv_rows(10))
    stats = run(tok_dir, tmp_path / "in", tmp_path / "out", "--max-bad-share", "0.3")
    train = stats["input"]["train"]
    assert train["rows_in"] == 4000 and train["dropped"] == drops(unclosed_quote=dropped)
    assert note in train["notes"]["unclosed_quote"]
    adds_up(stats)


def test_invalid_utf8_drops_the_row_not_the_file(tok_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    lines = [line.encode() for line in csv_rows(20)]
    lines[4] = b'1,"caf\xe9 in Latin-1","the title is not UTF-8"'  # line 6 of the file
    lines[9] = b'0,"fine","a stray \xff byte","and a field too many"'  # bad both ways: counted once
    (folder / "train.csv").write_bytes(b"label,title,content\n" + b"\n".join(lines) + b"\n")
    jsonl = [json.dumps(r).encode() for r in good_rows(20)]
    jsonl[7] = b'{"label": 1, "title": "t", "content": "caf\xe9"}'  # line 8
    (folder / "test.jsonl").write_bytes(b"\n".join(jsonl) + b"\n")
    stats = run(tok_dir, folder, tmp_path / "out", "--max-bad-share", "0.2")
    train, test = stats["input"]["train"], stats["input"]["test"]
    assert train["rows_in"] == 20 and train["dropped"] == drops(invalid_encoding=2) and train["rows_out"] == 18
    assert train["notes"]["invalid_encoding"] == f"{folder / 'train.csv'} line 6: not valid UTF-8"
    assert test["rows_in"] == 20 and test["dropped"] == drops(invalid_encoding=1) and test["rows_out"] == 19
    assert test["notes"]["invalid_encoding"] == f"{folder / 'test.jsonl'} line 8: not valid UTF-8"
    adds_up(stats)


def test_oversized_row_is_counted_and_the_rest_of_the_file_read(tok_dir: Path, tmp_path: Path) -> None:
    """Rows over readers.MAX_ROW_BYTES (one of 9 MB, more than two of pyarrow's blocks) are dropped and counted;
    a long review under the limit is kept."""
    folder = tmp_path / "in"
    folder.mkdir()
    huge = "great sound " * ((9 << 20) // 24)  # 4.5 MB
    long = "great sound " * ((rd.MAX_ROW_BYTES - 100) // 12)
    rows = csv_rows(30)
    rows[5] = f'1,"a huge one","{huge}\n{huge}"'  # quoted, two lines: one row
    rows[10] = f"0,unquoted,{huge[:2 << 20]}"
    rows[20] = f'1,"long but fine","{long}"'
    write_csv(folder / "train.csv", rows)
    jsonl = [json.dumps(r) for r in good_rows(30)]
    jsonl[3] = json.dumps({"label": 1, "title": "huge", "content": huge[:2 << 20]})
    (folder / "test.jsonl").write_text("\n".join(jsonl) + "\n")
    stats = run(tok_dir, folder, tmp_path / "out", "--max-bad-share", "0.1")
    train, test = stats["input"]["train"], stats["input"]["test"]
    assert train["rows_in"] == 30 and train["dropped"] == drops(oversized_row=2) and train["rows_out"] == 28
    assert train["notes"]["oversized_row"].endswith(f"train.csv line 7: a record of more than {rd.MAX_ROW_BYTES} "
                                                    "bytes")
    assert test["rows_in"] == 30 and test["dropped"] == drops(oversized_row=1) and test["rows_out"] == 29
    assert test["notes"]["oversized_row"].endswith("test.jsonl line 4: a line of more than 1048576 bytes")
    assert 32 in (stats["output"][s]["token_length"]["max"] for s in ("train", "validation"))  # the long review
    adds_up(stats)


def test_real_dump_shapes_parse_row_for_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Quoted multi-line reviews with commas and doubled quotes, CRLF, a BOM, gzip; read in pieces smaller than a
    row: every file gives back exactly the rows written, counted once each."""
    import csv
    import gzip

    monkeypatch.setattr(csv_records, "READ_BYTES", 100)
    rng = random.Random(5)
    rows = [(str(i % 2), rng.choice(["Great", "Meh, \"ok\"", "", "Two\nlines"]),
             rng.choice(["Fine.", "Line one\r\nline two, with \"quotes\"", "a,b\n\nc", " "]) + f" {i}")
            for i in range(200)]
    text = io.StringIO()
    csv.writer(text, quoting=csv.QUOTE_ALL, lineterminator="\r\n").writerows([("label", "title", "content"), *rows])
    data = "\ufeff" + text.getvalue()
    (tmp_path / "a.csv").write_text(data, newline="")
    (tmp_path / "b.csv.gz").write_bytes(gzip.compress(data.replace("\r\n", "\n").encode()))
    jsonl = "\ufeff" + "".join(json.dumps(dict(zip(("label", "title", "content"), r, strict=True))) + "\r\n"
                               for r in rows)
    (tmp_path / "c.jsonl").write_text(jsonl, newline="")
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(jsonl.encode()))
    for name in ("a.csv", "b.csv.gz", "c.jsonl", "d.jsonl.gz"):
        got = [(t, d) for t, d in rd.file_chunks(tmp_path / name)]
        assert sum(d.total for _, d in got) == 0, name
        table = pa.concat_tables(t for t, _ in got if t is not None)
        want = [tuple(v.replace("\r\n", "\n") for v in row) for row in rows] if name == "b.csv.gz" else rows
        assert list(zip(*(table[c].to_pylist() for c in ("label", "title", "content")), strict=True)) == want, name


def test_real_layouts_read_as_their_formats_say(tok_dir: Path, tmp_path: Path) -> None:
    """A DatasetDict saved under a folder whose name has a split word, a first title that is a column word in the
    release's CSV, a gzip whose extension is upper case, a JSON Lines file whose first line is not an object."""
    import gzip

    import datasets

    features = datasets.Features({"label": datasets.ClassLabel(names=["negative", "positive"]),
                                  "title": datasets.Value("string"), "content": datasets.Value("string")})
    saved = datasets.DatasetDict({split: datasets.Dataset.from_list(good_rows(n), features=features)
                                  for split, n in (("train", 6), ("test", 4))})
    saved.save_to_disk(str(tmp_path / "dict" / "polarity_training_data"))
    stats = run(tok_dir, tmp_path / "dict", tmp_path / "out-dict")
    assert (stats["input"]["train"]["rows_out"], stats["input"]["test"]["rows_out"]) == (6, 4)

    release = tmp_path / "release"
    release.mkdir()
    (release / "train.csv").write_text('"2","Review","Loved it"\n"1","Bad","Hated it"\n')
    with gzip.open(release / "TEST.CSV.GZ", "wt") as packed:
        packed.write('"2","Title","Great"\n"1","Text","Awful"\n')
    stats = run(tok_dir, release, tmp_path / "out-release", "--validation-share", "0")
    assert stats["input"]["train"]["rows_out"] == 2 and stats["input"]["test"]["rows_out"] == 2
    assert read(tmp_path / "out-release", "test")["title"].to_pylist() == ["Title", "Text"]

    lines = tmp_path / "lines"
    lines.mkdir()
    rows = [json.dumps(row) for row in good_rows(4)]
    (lines / "train.jsonl").write_text("\n".join(['["not", "an", "object"]', *rows]) + "\n")
    (lines / "test.json").write_text("\n".join(rows) + "\n")  # JSON Lines named .json, as datasets' to_json writes
    stats = run(tok_dir, lines, tmp_path / "out-lines", "--max-bad-share", "0.5", "--validation-share", "0")
    assert stats["input"]["train"]["dropped"] == drops(malformed_row=1) and stats["input"]["train"]["rows_out"] == 4
    assert stats["input"]["test"]["rows_out"] == 4


def test_a_split_with_no_valid_row_says_why_and_where(tok_dir: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "in"
    write_csv(folder / "train.csv", ["pos,Great,Loved it", "neg,Bad,Hated it"])
    write_csv(folder / "test.csv", ["1,Great,Loved it"])
    argv = [*step_arguments("Tokenize"),
            "--source", str(folder), "--model-id", str(tok_dir), "--output-dir", str(tmp_path / "out")]
    assert pre.main(argv) == 1
    assert (f"train: no valid rows (of 2: invalid_label=2); {folder / 'train.csv'} row 1 of a chunk: label 'pos' is "
            "not one of negative, positive") in capsys.readouterr().err
    argv[-5] = str(folder / "train.csv")  # the --source
    assert pre.main(argv) == 1
    assert f"input folder {folder / 'train.csv'} is a file: give the folder that holds it ({folder})" in \
        capsys.readouterr().err


def own_data(folder: Path, train: list[str], test: list[str]) -> Path:
    """A user's CSV files: columns category, subject, body."""
    for name, lines in (("train.csv", train), ("test.csv", test)):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("category,subject,body\n" + "\n".join(lines) + "\n")
    return folder


def test_own_columns_and_string_labels_found_in_the_train_split(tok_dir: Path, tmp_path: Path) -> None:
    """data.text_columns / label_column name the user's columns; without data.labels the train split's labels,
    sorted, are the names; each class gives its share to validation; every shard names them for train.py."""
    train = [f"{('spam', 'ham')[i % 3 == 0]},offer {i},buy now {i}" for i in range(60)]
    test = [" Spam ,offer,buy now", "ham,hello,see you", "HAM,,just a body"]  # case and spaces ignored
    folder = own_data(tmp_path / "in", train, test)
    stats = run(tok_dir, folder, tmp_path / "out", "--text-columns", '["subject", "body"]', "--label-column",
                "category", "--labels", "null", "--validation-share", "0.25")
    assert stats["labels"] == ["ham", "spam"]
    out = stats["output"]
    assert out["validation"]["labels"] == {"ham": 5, "spam": 10} and out["train"]["labels"] == {"ham": 15, "spam": 30}
    assert out["test"]["labels"] == {"ham": 2, "spam": 1}
    test_split = read(tmp_path / "out", "test")
    assert test_split["label"].to_pylist() == [1, 0, 0] and test_split["title"].to_pylist() == ["offer", "hello", None]
    for split in pre.SPLITS:
        assert json.loads(read(tmp_path / "out", split).schema.metadata[b"labels"]) == ["ham", "spam"]


def test_a_test_label_the_train_split_lacks_is_refused_naming_it(tok_dir: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    folder = own_data(tmp_path / "in", [f"{('spam', 'ham')[i % 2]},s {i},b {i}" for i in range(20)],
                      ["ham,a,b", "eggs,c,d"])
    argv = [*step_arguments("Tokenize"), "--source", str(folder), "--model-id", str(tok_dir), "--text-columns",
            '["subject", "body"]', "--label-column", "category", "--labels", "null", "--output-dir",
            str(tmp_path / "out")]
    assert pre.main(argv) == 1
    err = capsys.readouterr().err
    assert "label 'eggs' does not occur in the train split, whose labels are ham, spam" in err, err
    assert len(err.strip().splitlines()) == 1


def test_given_labels_take_names_or_indices_and_count_the_rest_as_bad_rows(tok_dir: Path, tmp_path: Path) -> None:
    train = [f"{('bad', 'good', '1', '0.0', 'true')[i % 5]},t {i},b {i}" for i in range(50)] + ["meh,t,b"]
    folder = own_data(tmp_path / "in", train, ["good,a,b", "bad,c,d"])
    stats = run(tok_dir, folder, tmp_path / "out", "--text-columns", '["body"]', "--label-column", "category",
                "--labels", '["bad", "good"]', "--validation-share", "0", "--max-bad-share", "0.05")
    assert stats["labels"] == ["bad", "good"]
    assert stats["output"]["train"]["labels"] == {"bad": 20, "good": 30}  # bad, 0.0 / good, 1, true
    assert stats["input"]["train"]["dropped"]["invalid_label"] == 1
    assert "label 'meh' is not one of bad, good" in stats["input"]["train"]["notes"]["invalid_label"]
    assert read(tmp_path / "out", "train")["token_type_ids"].to_pylist()[0] == [0, 0, 0, 0]  # one text, no pair


def test_any_number_of_classes_and_a_single_one_refused(tok_dir: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    stars = own_data(tmp_path / "in", [f"{i % 5 + 1},t {i},b {i}" for i in range(100)], ["5,a,b", "1,c,d"])
    stats = run(tok_dir, stars, tmp_path / "out", "--label-column", "category", "--text-columns",
                '["subject", "body"]', "--labels", "null", "--validation-share", "0.2")
    assert stats["labels"] == ["1", "2", "3", "4", "5"]  # star ratings, sorted as numbers
    assert stats["output"]["validation"]["labels"] == dict.fromkeys(["1", "2", "3", "4", "5"], 4)
    assert stats["output"]["test"]["labels"] == {"1": 1, "2": 0, "3": 0, "4": 0, "5": 1}
    assert read(tmp_path / "out", "test")["label"].to_pylist() == [4, 0]
    one = own_data(tmp_path / "one", [f"spam,t {i},b {i}" for i in range(10)], ["spam,a,b"])
    argv = [*step_arguments("Tokenize"), "--source", str(one), "--model-id", str(tok_dir), "--label-column",
            "category", "--text-columns", '["subject", "body"]', "--labels", "null",
            "--output-dir", str(tmp_path / "o")]
    assert pre.main(argv) == 1
    err = capsys.readouterr().err
    assert "the train split's labels: ['spam']: a classifier needs two or more classes" in err, err
    assert not (tmp_path / "o" / "train").exists()


@pytest.mark.parametrize("classes", [3, 20])
def test_a_sample_of_k_classes_names_them_and_balances_every_split(tok_dir: Path, tmp_path: Path,
                                                                     classes: int) -> None:
    names = rev.class_names(classes)
    stats = run(tok_dir, f"sample:{classes * 20}:{classes}", tmp_path / "out", "--labels", "null")
    assert stats["labels"] == sorted(names) == names  # product and polarity, found in the train split
    assert stats["output"]["validation"]["labels"] == dict.fromkeys(names, 4)  # 0.2 of 20 per class, stratified
    assert stats["output"]["train"]["labels"] == dict.fromkeys(names, 16)
    assert stats["output"]["test"]["labels"] == dict.fromkeys(names, 2)  # its classes * 2 rows
    test = read(tmp_path / "out", "test")
    assert sorted(set(test["label"].to_pylist())) == list(range(classes))


def test_a_sample_of_k_classes_is_deterministic_and_reads_as_reviews() -> None:
    rows = list(rev.sample_reviews("train", 60, 3, classes=3))
    assert rows == list(rev.sample_reviews("train", 60, 3, classes=3))
    assert [sum(label == k for label, _, _ in rows) for k in range(3)] == [20, 20, 20]
    products = [name.rpartition(" ")[0] for name in rev.class_names(3)]  # air fryer, air fryer, backpack
    about = [any(aspect in content for aspect in rev.PRODUCTS[products[label]]) for label, _, content in rows]
    assert sum(about) >= 0.7 * len(rows)  # most name an aspect of their class's product (the rest: verdicts only)
    assert list(rev.sample_reviews("train", 4, 3)) == list(rev.sample_reviews("train", 4, 3, classes=2))
    with pytest.raises(ValueError, match="a sample has 2 to 24 classes, not 25"):
        rev.class_names(25)


def test_found_labels_are_sorted_and_one_per_spelling_ignoring_case() -> None:
    def chunks(*labels: object):
        return iter([(pa.table({"label": list(labels)}), rd.Drops()), (None, rd.Drops())])

    assert rd.found_labels(chunks("Spam", "spam", "spam", "ham", " ham ", None, "")) == ["ham", "spam"]
    assert rd.found_labels(chunks(10, 9, 1.0, 2)) == ["1", "2", "9", "10"]  # numbers as numbers; 1.0 is 1
    assert rd.found_labels(chunks(True, False)) == ["0", "1"]
