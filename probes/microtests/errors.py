"""What a rank's error text says: a timeout, the ranks a monitored barrier named as missing,
why a rendezvous failed.

A leaf that imports nothing heavy: the ranks classify their own errors with it, and the judge
reads the same texts afterwards, locally and across a cluster.
"""

from __future__ import annotations

import re

_TIMEOUT = re.compile(r"timed? ?out|timeout|failed to pass monitoredBarrier|Watchdog caught collective", re.IGNORECASE)
_MISSING = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")


def classify(text: str) -> tuple[bool, list[int]]:
    """(is a timeout, the ranks a monitored barrier named as missing)."""
    missing = _MISSING.search(text)
    ranks = [int(r) for r in re.findall(r"\d+", missing.group(1))] if missing else []
    return bool(_TIMEOUT.search(text)), ranks


def rendezvous_error_kind(text: str) -> str:
    lowered = text.lower()
    for kind, needles in (
        ("address_in_use", ("address already in use", "eaddrinuse")),
        ("connection_refused", ("connection refused", "econnrefused")),
        ("timeout", ("timed out", "timeout")),
        ("hostname", ("name or service not known", "unknown host", "getaddrinfo")),
    ):
        if any(n in lowered for n in needles):
            return kind
    return "other"
