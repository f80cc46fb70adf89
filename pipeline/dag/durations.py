"""CacheConfig.ExpireAfter: the ISO 8601 durations SageMaker Pipelines reads, with or without the leading P and in
either case ("30d", "5y", "T16m", "30dT5h", "P30D", "PT12H": the developer guide's pipelines-caching-enabling)."""

from __future__ import annotations

import re
from datetime import timedelta

DURATION = re.compile(r"^P?(?:(\d+)Y)?(?:(\d+)M)?(?:(\d+)W)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$",
                      re.IGNORECASE)


def expire_after(text: str) -> timedelta:
    """The duration `text` names; a year is 365 days and a month 30. ValueError for anything else, or for one that
    names no amount ("P", "T", "P1DT")."""
    found = DURATION.match(text.strip())
    if not found or not any(found.groups()) or text.strip().upper().endswith("T"):
        raise ValueError(f"CacheConfig.ExpireAfter {text!r}: expected an ISO 8601 duration such as 30d, P30D, T16m "
                         f"or 30dT5h")
    years, months, weeks, days, hours, minutes, seconds = (int(g or 0) for g in found.groups())
    return timedelta(days=365 * years + 30 * months + 7 * weeks + days, hours=hours, minutes=minutes, seconds=seconds)
