"""Test fixtures for training/train.py: a tiny random BERT, its WordPiece tokenizer and a learnable task.

The task: a review is positive when its sentiment words are positive. Titles and contents are built from
filler words plus one sentiment word per six words (and one in the title); content lengths vary from a few
words to `max_words`, so batches fall into several sequence-length buckets.
"""

import functools
import random
from pathlib import Path

from fixtures_ml import write_tokenized
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers


@functools.lru_cache(maxsize=1)
def config_arguments() -> tuple[str, ...]:
    """train.py's hyperparameters as the Train step of `run --local` passes them (the config's local profile, the
    one home of their defaults): what a test that launches train.py itself starts from, its own values after them
    (argparse keeps the last)."""
    from pipeline.config import load_config
    from pipeline.definition import step_arguments

    root = Path(__file__).resolve().parents[1]
    return tuple(step_arguments(load_config(root / "pipeline.yaml", environ={}, local=True), "Train"))


POSITIVE = ["great", "excellent", "love", "wonderful", "perfect", "fantastic", "recommend", "happy"]
NEGATIVE = ["terrible", "awful", "hate", "broken", "poor", "waste", "disappointed", "refund"]
FILLER = [
    "the",
    "product",
    "it",
    "was",
    "and",
    "this",
    "book",
    "i",
    "bought",
    "for",
    "my",
    "son",
    "a",
    "with",
    "after",
    "two",
    "weeks",
    "of",
    "use",
    "quality",
    "price",
    "delivery",
    "box",
    "item",
    "really",
    "very",
]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def review(rng: random.Random, label: int, max_words: int) -> tuple[str, str]:
    """A (title, content) pair whose sentiment words all have the label's polarity."""
    words = POSITIVE if label == 1 else NEGATIVE
    content = [rng.choice(FILLER) for _ in range(rng.randint(3, max_words))]
    for _ in range(max(1, len(content) // 6)):
        content.insert(rng.randrange(len(content) + 1), rng.choice(words))
    title = [rng.choice(FILLER) for _ in range(rng.randint(0, 2))] + [rng.choice(words)]
    return " ".join(title), " ".join(content)


def make_tiny_model(folder: Path, max_position: int = 256) -> Path:
    """Save a random BertForSequenceClassification (hidden 32, 2 layers) and a WordPiece tokenizer."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(
        [" ".join(POSITIVE + NEGATIVE + FILLER)] * 3,
        trainers.WordPieceTrainer(vocab_size=200, special_tokens=SPECIALS),
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=max_position,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
    tokenizer.save_pretrained(folder)
    config = BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_position,
        num_labels=2,
    )
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def write_split(
    folder: Path,
    model_dir: Path,
    rows: int,
    seed: int,
    max_length: int = 128,
    max_words: int = 100,
    shards: int = 2,
) -> Path:
    """Tokenize `rows` balanced synthetic title/content reviews into the contract's Parquet shards."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(seed)
    labels = [i % 2 for i in range(rows)]
    rng.shuffle(labels)
    pairs = [review(rng, label, max_words) for label in labels]
    enc = tokenizer(
        [t for t, _ in pairs], [c for _, c in pairs], truncation="only_second", max_length=max_length
    )
    return write_tokenized(folder, enc["input_ids"], enc["token_type_ids"], labels, shards=shards)
