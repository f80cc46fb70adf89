"""The pipeline's side of experiment tracking: the MLflow stores, the `runs` table and each execution's summary plot.
The steps log (steps/tracking.py); this package reads, links runs to model versions, and draws."""
