"""Tokenize's data sources: which spelling names which source (the same on every machine), which file is which split,
and the layouts users bring (save_to_disk folders, gzipped Parquet, pandas' True/False labels)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from fixtures_ml import build_tokenizer, step_arguments

from pipeline.config import ConfigError, load_config
from pipeline.definition import definition
from steps.contract import source_kind
from steps.tokenize import preprocess as pre
from steps.tokenize import readers as rd

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def run(tok_dir: Path, source: str | Path, out: Path, *extra: str) -> dict:
    """Run the step in-process; return stats.json."""
    argv = [*step_arguments("Tokenize"),
            "--source", str(source), "--model-id", str(tok_dir), "--max-length", "32", "--validation-share", "0.2",
            "--seed", "7", "--output-dir", str(out), *extra]
    assert pre.main(argv) == 0
    return json.loads((out / "stats" / "stats.json").read_text())


def rows(n: int, start: int = 0) -> dict[str, list]:
    return {"label": [i % 2 for i in range(start, start + n)], "title": [f"title {i}" for i in range(start, start + n)],
            "content": [f"the sound quality is great {i}" for i in range(start, start + n)]}


@pytest.mark.parametrize(("source", "kind"), [
    ("sample", "sample"), ("sample:300", "sample"), ("samples", "hub"),
    ("s3://bucket/polarity/", "s3"),
    ("amazon_polarity", "hub"), ("fancyzhx/amazon_polarity", "hub"), ("data", "hub"),
    ("./data", "folder"), ("/srv/data", "folder"), ("~/data", "folder"), ("../data", "folder"),
    ("data/polarity/v2", "folder"),
])
def test_a_source_is_told_by_its_spelling(source: str, kind: str) -> None:
    assert source_kind(source) == kind


def test_a_folder_named_like_the_hub_dataset_does_not_change_the_definition(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The definition is built on a laptop and run on AWS: a folder that happens to sit in the working directory
    must not turn the Hub dataset into a local one (whose jobs would run with the Hub switched off)."""
    monkeypatch.chdir(tmp_path)
    before = definition(load_config(ROOT / "pipeline.yaml", ["training.model_id=bert-base-uncased"], environ={}))
    (tmp_path / "amazon_polarity").mkdir()
    (tmp_path / "bert-base-uncased").mkdir()
    after = definition(load_config(ROOT / "pipeline.yaml", ["training.model_id=bert-base-uncased"], environ={}))
    assert after == before
    assert "HF_HUB_OFFLINE" not in after


@pytest.mark.parametrize(("source", "message"), [
    ("sample:abc", "data.source='sample:abc': expected sample, sample:N or sample:N:K with N >= 1 train rows and K >= 2"
                   " classes"),
    ("sample:0", "data.source='sample:0': expected sample, sample:N or sample:N:K"),
    ("sample:10:1", "data.source='sample:10:1': expected sample, sample:N or sample:N:K"),
    ("sample:10:25", "data.source='sample:10:25': a sample has 2 to 24 classes, not 25"),
    ("s3://", "data.source='s3://': expected an S3 URI like s3://bucket/prefix/"),
])
def test_a_bad_source_names_the_field(source: str, message: str) -> None:
    with pytest.raises(ConfigError, match="data.source") as error:
        load_config(ROOT / "pipeline.yaml", [f"data.source={source}"], environ={})
    assert message in str(error.value)


@pytest.mark.parametrize(("path", "split"), [
    ("train.csv", "train"), ("Test.CSV", "test"), ("amazon_polarity_train.csv", "train"),
    ("train-00000-of-00002.parquet", "train"), ("test2.jsonl.gz", "test"), ("my eval set.csv", "test"),
    ("training/part-0.csv", "train"), ("testing/part-0.csv", "test"),
    ("train/latest.csv", "train"), ("test/contest-entries.csv", "test"), ("train/attested.csv", "train"),
    ("restraint/test.csv", "test"),
    ("latest.csv", None), ("constraints/part-0.csv", None), ("trainset.csv", None), ("validation.csv", None),
    ("train_test.csv", None),
])
def test_a_split_is_a_whole_word_of_the_file_name_then_of_its_folders(tmp_path: Path, path: str,
                                                                      split: str | None) -> None:
    assert rd.split_of(tmp_path / path, tmp_path) == split


def test_a_file_whose_name_only_contains_test_stays_in_its_folders_split(tok_dir: Path, tmp_path: Path) -> None:
    """train/latest.csv is training data, not test data because "latest" contains "test"."""
    for folder, name, table in (("train", "latest.csv", rows(40)), ("test", "part-0.csv", rows(10, 100))):
        (tmp_path / "in" / folder).mkdir(parents=True)
        pacsv.write_csv(pa.table(table), tmp_path / "in" / folder / name)
    stats = run(tok_dir, tmp_path / "in", tmp_path / "out")
    assert stats["input"]["train"]["rows_in"] == 40 and stats["input"]["test"]["rows_in"] == 10


def test_a_save_to_disk_folder_is_read_from_its_arrow_files(tok_dir: Path, tmp_path: Path) -> None:
    """datasets' DatasetDict.save_to_disk: train/ and test/ of .arrow files (IPC stream) beside state.json and
    dataset_info.json, which are metadata, not rows."""
    import datasets

    features = datasets.Features({"label": datasets.ClassLabel(names=["negative", "positive"]),
                                  "title": datasets.Value("string"), "content": datasets.Value("string")})
    saved = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict(rows(50), features=features),
        "test": datasets.Dataset.from_dict(rows(12, 100), features=features),
    })
    saved.save_to_disk(str(tmp_path / "polarity"), num_shards={"train": 2, "test": 1})
    stats = run(tok_dir, tmp_path / "polarity", tmp_path / "out", "--max-bad-share", "0")
    assert stats["input"]["train"]["rows_in"] == 50 and stats["input"]["test"]["rows_in"] == 12
    assert stats["input"]["train"]["rows_out"] == 50


def test_arrow_ipc_files_of_both_formats_and_gzipped(tmp_path: Path) -> None:
    table = pa.table(rows(30))
    with pa.ipc.new_stream(tmp_path / "stream.arrow", table.schema) as writer:
        writer.write_table(table, max_chunksize=7)
    with pa.ipc.new_file(tmp_path / "file.arrow", table.schema) as writer:
        writer.write_table(table, max_chunksize=7)
    (tmp_path / "stream.arrow.gz").write_bytes(gzip.compress((tmp_path / "stream.arrow").read_bytes()))
    for name in ("stream.arrow", "file.arrow", "stream.arrow.gz"):
        got = pa.concat_tables(t for t, _ in rd.file_chunks(tmp_path / name))
        assert got["content"].to_pylist() == table["content"].to_pylist(), name
        assert got["label"].to_pylist() == table["label"].to_pylist(), name


def test_a_gzipped_parquet_file_is_read(tok_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    for name, table in (("train.parquet.gz", rows(40)), ("test.parquet.gz", rows(10, 100))):
        buffer = pa.BufferOutputStream()
        pq.write_table(pa.table(table), buffer)
        (tmp_path / "in" / name).write_bytes(gzip.compress(buffer.getvalue().to_pybytes()))
    stats = run(tok_dir, tmp_path / "in", tmp_path / "out", "--max-bad-share", "0")
    assert stats["input"]["train"]["rows_out"] == 40 and stats["input"]["test"]["rows_out"] == 10


def test_true_false_labels_as_pandas_writes_them_are_labels(tok_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    lines = ["label,title,content"] + [f"{'True' if i % 2 else 'False'},t {i},the sound is fine {i}" for i in range(40)]
    (tmp_path / "in" / "train.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "in" / "test.jsonl").write_text("".join(
        json.dumps({"label": "true" if i % 2 else "false", "content": f"fine {i}"}) + "\n" for i in range(10)))
    stats = run(tok_dir, tmp_path / "in", tmp_path / "out", "--max-bad-share", "0")
    assert stats["input"]["train"]["rows_out"] == 40 and stats["input"]["test"]["rows_out"] == 10
    labels = pa.concat_tables(pq.read_table(f) for f in sorted((tmp_path / "out" / "test").glob("*.parquet")))
    assert sorted(labels["label"].to_pylist()) == [0] * 5 + [1] * 5


def test_a_missing_local_folder_is_reported_as_a_folder_not_looked_up_on_the_hub(tok_dir: Path,
                                                                                 tmp_path: Path) -> None:
    with pytest.raises(rd.StepError, match=r"input folder .*missing does not exist"):
        rd.source_chunks(pre.parse_args([*step_arguments("Tokenize"),
                                         "--source", str(tmp_path / "missing"), "--model-id", str(tok_dir)]))
