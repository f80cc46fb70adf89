"""An execution's summary picture: the Train step's loss and throughput per log interval and the test split's
confusion matrix, from the step files (training_stats.json, evaluation.json), one PNG beside the execution's records."""

from __future__ import annotations

from pathlib import Path

PLOT_FILE = "summary.png"


def write_summary_plot(path: Path, stats: dict | None, report: dict | None, title: str) -> Path | None:
    """Draw what `stats` and `report` hold into `path` (None, and nothing written, when they hold neither)."""
    intervals = (stats or {}).get("intervals") or []
    matrix = ((report or {}).get("classification") or {}).get("confusion_matrix")  # actual -> predicted, by name
    if not intervals and not matrix:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss, speed, confusion) = plt.subplots(1, 3, figsize=(15, 4.2))
    steps = [i["step"] for i in intervals]
    loss.plot(steps, [i["loss"] for i in intervals], marker="o")
    loss.set(title="training loss (per log interval)", xlabel="optimizer step", ylabel="loss")
    speed.plot(steps, [i["samples_per_sec"] for i in intervals], marker="o", color="tab:green")
    steady = (stats or {}).get("samples_per_sec")  # the steady state: the intervals after the warm-up
    if steady:
        speed.axhline(steady, linestyle="--", color="grey", label=f"steady state {steady:,.1f}")
        speed.legend()
    speed.set(title="throughput", xlabel="optimizer step", ylabel="samples / s")
    if matrix:
        names = list(matrix)
        cells = [[int(matrix[t][p]) for p in names] for t in names]
        confusion.imshow(cells, cmap="Blues")
        for t in range(len(names)):
            for p in range(len(names)):
                confusion.text(p, t, f"{cells[t][p]:,}", ha="center", va="center")
        ticks = list(range(len(names)))
        confusion.set(title="test split: confusion matrix", xlabel="predicted", ylabel="true",
                      xticks=ticks, yticks=ticks, xticklabels=names, yticklabels=names)
    else:
        confusion.set_axis_off()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
