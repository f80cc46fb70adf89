"""`compare`: the Train step alone, once per instance type, on the same data and work: time, cost, quality.

plan: the CreateTrainingJob requests; run: start and follow them on SageMaker, and `Comparison`, the command's
order of these; report: the side-by-side numbers (rendered by pipeline.views).
"""

from pipeline.compare.plan import DEVICES, CompareError, Plan, check_instance_types, plan, split_batch, tokenized_at
from pipeline.compare.report import Report, Row, report
from pipeline.compare.run import Comparison, describe, instance_types, latest_tokenized, start, wait

__all__ = [
    "DEVICES",
    "CompareError",
    "Comparison",
    "Plan",
    "Report",
    "Row",
    "check_instance_types",
    "describe",
    "instance_types",
    "latest_tokenized",
    "plan",
    "report",
    "split_batch",
    "start",
    "tokenized_at",
    "wait",
]
