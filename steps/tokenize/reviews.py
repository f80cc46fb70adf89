"""Sample reviews: synthetic Amazon-Polarity-like (title, content) reviews that the project makes itself.

Mostly clear reviews, some mixed ones (the label wins), a few ambiguous ones, with negations, fillers and titles.
Two classes: negative (0) / positive (1), of any product. More (up to MAX_CLASSES): each class a product and a
polarity, named so ("air fryer negative", "air fryer positive", "backpack negative", ...: the first `classes` of
them in that order). Deterministic for a given split, seed and class count; pure Python, so benchmarks can use it
without pyarrow.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

PRODUCTS = {  # product: the aspects a review of it talks about
    name: aspects.split(", ")
    for name, _, aspects in (line.partition(": ") for line in """
headphones: sound quality, battery life, noise cancelling, ear cushions, connection
blender: motor, lid, blades, cleanup, noise level
novel: plot, characters, writing, ending, pacing
running shoes: fit, cushioning, sizing, stitching, grip
coffee maker: coffee, carafe, timer, water tank, temperature
phone case: fit, buttons, grip, color, drop protection
board game: rules, artwork, replay value, pieces, box
documentary: narration, picture quality, soundtrack, story, editing
backpack: zippers, straps, fabric, pockets, stitching
air fryer: basket, timer, temperature control, cleanup, size
e-reader: screen, battery life, page turns, light, software
cookbook: recipes, photos, instructions, index, ingredients list
""".strip().splitlines())
}
GOOD = ["great", "excellent", "fantastic", "solid", "impressive", "reliable", "sturdy", "wonderful", "superb",
        "well made", "comfortable", "easy to use", "better than expected", "top notch"]
BAD = ["poor", "terrible", "flimsy", "disappointing", "awful", "cheap", "useless", "unreliable",
       "frustrating", "mediocre", "badly made", "worse than expected", "a letdown", "annoying"]
INTENSIFIERS = ["", "", "really ", "very ", "truly ", "pretty ", "absolutely "]
GOOD_OVERALL = ["Worth every penny.", "Five stars from me.", "I would buy it again in a heartbeat.",
                "Highly recommended.", "My whole family loves it.", "Best purchase I made this year.",
                "It does exactly what it promises.", "I am very happy with it."]
BAD_OVERALL = ["Waste of money.", "One star, and that is generous.", "I returned it the next day.",
               "Do not buy this.", "I regret this purchase.", "Customer service never answered my emails.",
               "It stopped working after {n} {unit}.", "Save your money and look elsewhere."]
GOOD_NEGATED = ["I have no complaints about the {aspect}.", "Not a single problem with the {aspect} so far.",
                "The {aspect} {be} not bad at all.", "I never had an issue with the {aspect}.",
                "You won't be disappointed by the {aspect}."]
BAD_NEGATED = ["The {aspect} {be} not {good}.", "I can't say the {aspect} {be} {good}.",
               "The {aspect} never worked properly.", "Nothing about the {aspect} is {good}.",
               "I would not call the {aspect} {good}."]
NEUTRAL = ["I bought this for my {who}.", "It arrived in {n} days.", "I have been using it for {n} {unit}.",
           "The packaging was plain.", "I ordered the {color} one.", "It came with a short manual.",
           "I read a lot of reviews before ordering.", "This is my second one."]
GOOD_TITLES = ["Great {product}", "Love it", "Five stars", "Exactly what I needed", "Better than expected",
               "Highly recommend", "Works perfectly", "So happy with this {product}"]
BAD_TITLES = ["Disappointed", "Broke after a week", "Not as described", "Save your money", "Not great",
              "Do not buy", "Poor quality {product}", "What a letdown"]
NEUTRAL_TITLES = ["{Product} review", "Mixed feelings", "It's okay", "Some thoughts", "Read before buying"]
FILL = {"who": ["son", "daughter", "wife", "husband", "mother", "office", "dorm room", "best friend"],
        "unit": ["days", "weeks", "months"], "color": ["black", "blue", "red", "white", "green", "grey"]}


def _fill(rng: random.Random, template: str, product: str, aspect: str) -> str:
    return template.format(
        product=product, Product=product.capitalize(), aspect=aspect, n=rng.randint(2, 11),
        be="are" if aspect.endswith("s") else "is",
        good=rng.choice(GOOD), who=rng.choice(FILL["who"]), unit=rng.choice(FILL["unit"]),
        color=rng.choice(FILL["color"]))


def _sentence(rng: random.Random, positive: bool, product: str, aspects: list[str]) -> str:
    """One sentence of the given polarity: a plain judgement, a negation, or an overall verdict."""
    aspect = rng.choice(aspects)
    kind = rng.random()
    if kind < 0.45:
        adj = rng.choice(GOOD if positive else BAD)
        text = "The {aspect} {be} " + ("" if " " in adj else rng.choice(INTENSIFIERS)) + adj + "."
    elif kind < 0.75:
        text = rng.choice(GOOD_NEGATED if positive else BAD_NEGATED)
    else:
        text = rng.choice(GOOD_OVERALL if positive else BAD_OVERALL)
    return _fill(rng, text, product, aspect)


MAX_CLASSES = 2 * len(PRODUCTS)


def class_names(classes: int) -> list[str]:
    """The label names of a sample of `classes` classes (2: negative, positive)."""
    if not 2 <= classes <= MAX_CLASSES:
        raise ValueError(f"a sample has 2 to {MAX_CLASSES} classes, not {classes}")
    if classes == 2:
        return ["negative", "positive"]
    return [f"{product} {polarity}" for product in sorted(PRODUCTS) for polarity in ("negative", "positive")][:classes]


def synthetic_review(rng: random.Random, label: int, product: str | None = None) -> tuple[str, str]:
    """A (title, content) review (of `product`, else of one drawn): mostly clear, some mixed, a few ambiguous, with
    negations and fillers; label 1 is praise."""
    drawn = rng.choice(sorted(PRODUCTS))
    product = product or drawn
    aspects = PRODUCTS[product]
    kind = rng.random()
    n = rng.choice([1, 2, 2, 3, 3, 4, 4, 5, 6, 8]) if rng.random() > 0.05 else rng.randint(12, 30)
    if kind < 0.70:  # clear
        polarities = [label == 1] * n
    elif kind < 0.93:  # mixed: the label wins, with one or two sentences the other way
        k = min(n, rng.randint(1, 2))
        polarities = [label == 1] * (n + 1) + [label != 1] * k
    else:  # ambiguous: as much praise as criticism, the label is not in the text
        half = max(1, n // 2)
        polarities = [True] * half + [False] * half
    rng.shuffle(polarities)
    sentences: list[str] = []
    for p in polarities:
        for _ in range(3):  # avoid saying the same thing twice, within reason
            text = _sentence(rng, p, product, aspects)
            if text not in sentences:
                break
        sentences.append(text)
    for i in range(1, len(sentences)):
        if polarities[i] != polarities[i - 1] and rng.random() < 0.6:
            sentences[i] = rng.choice(["But ", "However, ", "On the other hand, "]) + \
                sentences[i][0].lower() + sentences[i][1:]
    for _ in range(rng.choice([0, 0, 1, 1, 2])):
        sentences.insert(rng.randint(0, len(sentences)), _fill(rng, rng.choice(NEUTRAL), product, aspects[0]))
    t = rng.random()
    if t < 0.1:
        title = ""
    elif kind >= 0.70 and t < 0.4:
        title = _fill(rng, rng.choice(NEUTRAL_TITLES), product, aspects[0])
    else:
        title = _fill(rng, rng.choice(GOOD_TITLES if label == 1 else BAD_TITLES), product, aspects[0])
    return title, " ".join(sentences)


def sample_reviews(split: str, rows: int, seed: int, classes: int = 2) -> Iterator[tuple[int, str, str]]:
    """`rows` (label, title, content) reviews of a split, labels exactly balanced within each run of `classes` rows
    (label: an index into class_names(classes))."""
    names = class_names(classes)
    if classes == 2:
        rng = random.Random(f"sample-{split}-{seed}")
        first = 0
        for i in range(rows):
            if i % 2 == 0:
                first = int(rng.random() < 0.5)
            label = first if i % 2 == 0 else 1 - first
            title, content = synthetic_review(rng, label)
            yield label, title, content
        return
    rng = random.Random(f"sample-{split}-{seed}-{classes}")
    order: list[int] = []
    for i in range(rows):
        if i % classes == 0:
            order = rng.sample(range(classes), classes)
        label = order[i % classes]
        product, _, polarity = names[label].rpartition(" ")
        title, content = synthetic_review(rng, int(polarity == "positive"), product)
        yield label, title, content
