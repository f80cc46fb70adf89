"""A bag-of-words baseline scored beside the model: is fine-tuning BERT worth it on this data?

TF-IDF of the Tokenize step's word pieces (unigrams and bigrams of token ids: the texts of the train split are not
kept, its tokens are) and a logistic regression, scikit-learn's (both CPU images ship it), fitted on a seeded sample
of at most `rows` rows of the train split and scored on every row of the test split, the very rows the model's
metrics count. The sample bounds its cost whatever the split's size: at Amazon Polarity's scale (100,000 of its
3.6M train rows, the default, and its 400,000 test rows) it fits in 5 s and scores in 11 s on a 2-core machine, with
the accuracy of scikit-learn's TfidfVectorizer on the texts (0.9852 against 0.9854 on the sample reviews) in 0.84 of
its time (benchmarks/bench_baseline.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from steps.contract import StepError
from steps.evaluation import quality

FEATURES = 2**18  # hashed unigram and bigram ids: a fixed width, whatever the vocabulary (or class count)


def bag(ids: pa.ChunkedArray | pa.Array) -> Any:
    """Rows of token ids as a sparse matrix of unigram and bigram counts (bigrams hashed into FEATURES columns)."""
    from scipy import sparse

    column = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    offsets, values = column.offsets.to_numpy().astype(np.int64), column.values.to_numpy().astype(np.int64)
    row = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    same_row = row[1:] == row[:-1]
    bigrams = (values[:-1][same_row] * 1_000_003 + values[1:][same_row]) % FEATURES
    columns = np.concatenate([values % FEATURES, bigrams])
    rows = np.concatenate([row, row[1:][same_row]])
    counts = sparse.csr_matrix((np.ones(len(columns), np.float32), (rows, columns)),
                               shape=(len(offsets) - 1, FEATURES))
    counts.sum_duplicates()
    return counts


def read_train(train_dir: Path, rows: int, seed: int) -> tuple[pa.ChunkedArray, np.ndarray]:
    """A seeded sample of at most `rows` rows of the train split: their input_ids and labels."""
    files = sorted(train_dir.glob("*.parquet")) if train_dir.is_dir() else []
    if not files:
        raise StepError(f"no Parquet files in train folder {train_dir}")
    try:
        sizes = [pq.ParquetFile(path).metadata.num_rows for path in files]
        total = sum(sizes)
        chosen = np.sort(np.random.default_rng(seed).choice(total, size=min(rows, total), replace=False))
        parts, start = [], 0
        for path, size in zip(files, sizes, strict=True):
            mine = chosen[(chosen >= start) & (chosen < start + size)] - start
            if len(mine):
                parts.append(pq.read_table(path, columns=["input_ids", "label"]).take(pa.array(mine)))
            start += size
    except (OSError, pa.ArrowException) as e:
        raise StepError(f"cannot read the train split in {train_dir}: {type(e).__name__}: {e}") from e
    table = pa.concat_tables(parts)
    return table["input_ids"], table["label"].to_numpy().astype(np.int64)


def score(train_dir: Path, test: pa.Table, labels: np.ndarray, names: list[str], rows: int, seed: int,
          model: dict[str, Any], gate_metric: str) -> dict[str, Any]:
    """The baseline's accuracy and macro-F1 on the test rows, and the model's margin over it on `gate_metric`."""
    from sklearn.feature_extraction.text import TfidfTransformer
    from sklearn.linear_model import LogisticRegression

    began = time.perf_counter()
    ids, train_labels = read_train(train_dir, rows, seed)
    tfidf = TfidfTransformer(sublinear_tf=True)
    classifier = LogisticRegression(C=4.0, max_iter=300, random_state=seed)
    classifier.fit(tfidf.fit_transform(bag(ids)), train_labels)
    probabilities = np.zeros((len(test), len(names)))
    probabilities[:, classifier.classes_] = classifier.predict_proba(tfidf.transform(bag(test["input_ids"])))
    metrics = quality.classification_metrics(labels, probabilities.argmax(axis=1), names, seed)
    found = {"accuracy": metrics["accuracy"]["value"], "macro_f1": metrics["macro_f1"]["value"]}
    margin = model[gate_metric] - found[gate_metric]
    return {"model": "tf-idf (word-piece unigrams and bigrams) + logistic regression", "train_rows": len(train_labels),
            **{key: round(value, 6) for key, value in found.items()}, "metric": gate_metric,
            "margin": round(margin, 6), "beaten": bool(margin > 0),
            "seconds": round(time.perf_counter() - began, 3)}
