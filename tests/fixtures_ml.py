"""Tiny offline stand-ins for the real model: a WordPiece tokenizer and a random 2-layer BERT classifier.

Both are built in well under a second, saved to folders, and load with the Auto* classes like a Hub model.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

ROOT = Path(__file__).resolve().parents[1]
STEPS = ROOT / "steps"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CORPUS = [
    "the sound quality is great and the battery life is excellent",
    "the motor is terrible and the lid is flimsy, waste of money",
    "i have no complaints about the fit. five stars from me",
    "not a single problem so far. highly recommended",
    "the plot is not impressive. i returned it the next day",
    "do not buy this. the stitching is cheap and the zippers broke",
    "love it, works perfectly, exactly what i needed",
    "disappointed: broke after a week, customer service never answered",
    "mixed feelings. the screen is superb but the software is annoying",
]


@functools.cache
def step_arguments(step: str) -> tuple[str, ...]:
    """What step `step` (Tokenize or Evaluate) passes its script under the shipped config, the one home of those
    defaults (the scripts default none of them), the container's folders left out: a test's own arguments follow
    (argparse keeps the last)."""
    from pipeline.config import load_config
    from pipeline.definition import step_arguments as of_step

    given = tuple(of_step(load_config(ROOT / "pipeline.yaml", environ={}), step))
    # Evaluate's baseline reads a train split, which most tests have no need of: those that test it ask for it
    return (*given, "--baseline-rows", "0") if step == "Evaluate" else given


def build_tokenizer(folder: Path, extra_texts: list[str] | None = None, vocab_size: int = 400) -> Path:
    """A lowercase WordPiece tokenizer of a few sentences, saved as a fast HF tokenizer. Its vocabulary is made here,
    the same on every run (the `tokenizers` trainer breaks ties in another order on each run, so the same texts
    gave other token ids and lengths): the special tokens, every character alone and as a "##" piece, then the most
    frequent words (ties by spelling) up to `vocab_size`, filled with [unused] pieces."""
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = Counter(word for text in CORPUS + (extra_texts or [])
                    for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
    chars = sorted({c for word in words for c in word})
    vocab = [*SPECIALS, *chars, *(f"##{c}" for c in chars)]
    vocab += [w for w, _ in sorted(words.items(), key=lambda item: (-item[1], item[0])) if w not in vocab]
    vocab = vocab[:max(vocab_size, len(SPECIALS) + 2 * len(chars))]
    vocab += [f"[unused{i}]" for i in range(vocab_size - len(vocab))]  # BERT's way: ids up to vocab_size - 1 exist
    tok = Tokenizer(models.WordPiece({piece: i for i, piece in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
    tok.decoder = decoders.WordPiece()  # as BERT's tokenizer.json: "##" pieces join their word when decoded
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    specials = {f"{name}_token": f"[{name.upper()}]" for name in ("unk", "pad", "cls", "sep", "mask")}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=512, **specials)
    fast.save_pretrained(str(folder))
    return folder


def sample_texts(rows: int = 300) -> list[str]:
    """`rows` reviews of the sample generator (not of any split a run uses), to train a tokenizer on."""
    from steps.tokenize import reviews

    return [f"{title} {content}" for _, title, content in reviews.sample_reviews("vocabulary", rows, 7)]


def run_overrides(model: Path, rows: int, max_steps: int, *more: str) -> list[str]:
    """Config overrides for `run --local` with a tiny `model` on `rows` sample reviews, 2 ranks, `max_steps` steps."""
    training = {"model_id": model, "max_steps": max_steps, "batch_size": 8, "max_length": 64, "log_interval": 1}
    return [f"local.overrides.data.source=sample:{rows}",
            *(f"local.overrides.training.{key}={value}" for key, value in training.items()),
            "local.processes=2", *more]


def build_model(
    folder: Path, tokenizer_dir: Path, seed: int = 0, labels: tuple[str, ...] = ("negative", "positive")
) -> Path:
    """A random BertForSequenceClassification (hidden 32, 2 layers) saved with the tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_labels=len(labels), pad_token_id=0,
                        id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)})
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


def build_split_model(
    folder: Path,
    tokenizer_dir: Path,
    texts: list[str],
    seed: int = 0,
    labels: tuple[str, str] = ("negative", "positive"),
) -> Path:
    """build_model, then a sensitive classifier whose threshold lies half-way between two of `texts`' margins, so
    that it labels half of them positive and half negative, each with its own score."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    build_model(folder, tokenizer_dir, seed, labels)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        torch.manual_seed(seed)
        model.classifier.weight.normal_(0, 1)
        pooled = model.bert(**tokenizer(texts, padding=True, return_tensors="pt")).pooler_output
        direction = model.classifier.weight[1] - model.classifier.weight[0]
        margins = (pooled @ direction).sort().values
        middle = len(texts) // 2
        center = float(margins[middle - 1] + margins[middle]) / 2
        scale = 4 / float((margins - center).abs().max())  # margins spread over [-4, 4]: scores from 0.5 to 0.98
        model.classifier.weight.copy_(torch.stack([torch.zeros_like(direction), direction * scale]))
        model.classifier.bias.copy_(torch.tensor([0.0, -center * scale]))
    model.save_pretrained(str(folder))
    return folder


def write_tokenized(folder: Path, input_ids: list[list[int]], token_type_ids: list[list[int]], labels: list[int],
                    shards: int = 2, texts: list[tuple[str | None, str]] | None = None,
                    names: tuple[str, ...] = ("negative", "positive")) -> Path:
    """A tokenized split written by preprocess.py's own SplitWriter and schema, rows in order over `shards` files;
    with `texts` (title, content) per row, a test split as the Tokenize step writes it."""
    import numpy as np
    import pyarrow as pa

    from steps.tokenize import preprocess as pre

    columns = {"input_ids": input_ids, "token_type_ids": token_type_ids, "label": labels,
               "length": [len(ids) for ids in input_ids]}
    schema = pre.SCHEMA if texts is None else pre.TEST_SCHEMA
    if texts is not None:
        columns |= {"title": [title for title, _ in texts], "content": [content for _, content in texts]}
    table = pa.table(columns, schema=schema)
    longest = max((len(ids) for ids in input_ids), default=1)
    writer = pre.SplitWriter(folder, longest, rows_per_shard=max(1, -(-len(labels) // shards)), schema=schema,
                             names=list(names))
    writer.write(table, np.zeros(len(labels), bool))
    writer.close()
    return folder


def add_serving_code(model_dir: Path) -> Path:
    """Ship training/inference.py as code/inference.py, as train.py does."""
    (model_dir / "code").mkdir(exist_ok=True)
    (model_dir / "code" / "inference.py").write_bytes((ROOT / "training" / "inference.py").read_bytes())
    return model_dir


def add_onnx_graphs(model_dir: Path) -> Path:
    """Build onnx/model-fp32.onnx and onnx/model-int8.onnx in model_dir as the Evaluate step does (serving.py)."""
    from steps.evaluation import serving

    serving.build(model_dir)
    return model_dir


def ctrl_c_reaches_it() -> None:
    """A `preexec_fn` for a child that a test interrupts as a terminal would: SIGINT back to its default action. A
    job started in the background without job control (a CI runner's `cmd &` in a subshell) ignores SIGINT, and
    that disposition is inherited: the child's Python would then ignore Ctrl-C, as `nohup` users want."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
