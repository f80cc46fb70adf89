"""Paired comparisons of two models scored on the same rows, standard library only (it runs in the deploy Lambda as
well as in the Evaluate step).

`difference` is the accuracy difference of two 0/1 outcomes of the same rows with its 95% interval, from the paired
2x2 table's discordant cells (Agresti and Min 2005: 0.5 added to each cell, so that no discordant pair still gives
a width). `macro_f1_difference` is the macro-F1 difference with a seeded paired bootstrap interval: each resample
draws rows, and both models are scored on the same drawn rows.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Hashable, Sequence

Z95 = 1.959964
RESAMPLES = 1000  # the paired bootstrap's: its 2.5% and 97.5% quantiles are the 25th and 975th of them


def difference(first_only: int, second_only: int, rows: int) -> tuple[float, float, float]:
    """accuracy(first) - accuracy(second) on `rows` rows, of which `first_only` the first model alone got right and
    `second_only` the second alone, with its 95% interval."""
    b2, c2, n2 = first_only + 0.5, second_only + 0.5, rows + 2
    center = (b2 - c2) / n2
    half = Z95 * math.sqrt(max((b2 + c2) / n2 - center**2, 0.0) / n2)
    return (first_only - second_only) / rows if rows else 0.0, max(-1.0, center - half), min(1.0, center + half)


def macro_f1(pairs: Counter, classes: Sequence[Hashable]) -> float:
    """Macro-F1 over `classes` from counts of (label, prediction) pairs (a class with no row and no prediction
    scores 0, as scikit-learn's default)."""
    total = 0.0
    for name in classes:
        tp = pairs.get((name, name), 0)
        labelled = sum(count for (label, _), count in pairs.items() if label == name)
        predicted = sum(count for (_, prediction), count in pairs.items() if prediction == name)
        total += 2 * tp / (labelled + predicted) if labelled + predicted else 0.0
    return total / len(classes) if classes else 0.0


def macro_f1_difference(labels: Sequence[Hashable], first: Sequence[Hashable], second: Sequence[Hashable],
                        seed: int = 0, resamples: int = RESAMPLES) -> tuple[float, float, float]:
    """macro_f1(first) - macro_f1(second) on the same rows, with the 95% interval of a seeded paired bootstrap."""
    classes = sorted(set(labels), key=str)
    rows = list(zip(labels, first, second, strict=True))

    def gap(drawn: Sequence[tuple]) -> float:
        counts = Counter(drawn)
        one, two = Counter(), Counter()
        for (label, a, b), count in counts.items():
            one[label, a] += count
            two[label, b] += count
        return macro_f1(one, classes) - macro_f1(two, classes)

    if not rows:
        return 0.0, -1.0, 1.0
    draw = random.Random(seed)
    gaps = sorted(gap(draw.choices(rows, k=len(rows))) for _ in range(resamples))
    return gap(rows), gaps[int(0.025 * resamples)], gaps[min(resamples - 1, int(0.975 * resamples))]
