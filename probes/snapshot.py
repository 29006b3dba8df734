"""Snapshots: the Facts model as a JSON file, read back within caps and upgraded from older schemas.

A snapshot is ``Facts.model_dump_json()``; ``load_snapshot`` reads one back, ``dump_snapshot``
writes one with every credential redacted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from probes.facts import SCHEMA_VERSION, Facts


class SnapshotError(ValueError):
    """A snapshot that cannot be read: the message names the file and the place."""


# Upgrades from older snapshot versions: version -> function that returns the data of
# version + 1. Empty while there is only version 1; add one per schema change.
UPGRADES: dict[int, Any] = {}


def facts_from_dict(data: Any, origin: str = "<snapshot>") -> Facts:
    """Validate snapshot data, upgrading older schema versions; errors name ``origin``."""
    if not isinstance(data, dict) or "schema_version" not in data:
        raise SnapshotError(f"{origin}: not a diagnose snapshot (no schema_version)")
    version = data["schema_version"]
    if not isinstance(version, int):
        raise SnapshotError(f"{origin}: schema_version must be an integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise SnapshotError(
            f"{origin}: snapshot schema {version} is newer than this diagnose reads "
            f"({SCHEMA_VERSION}); upgrade lightning-diagnose"
        )
    while version < SCHEMA_VERSION:
        if version not in UPGRADES:
            raise SnapshotError(f"{origin}: snapshot schema {version} is no longer supported")
        data = UPGRADES[version](data)
        version = data["schema_version"]
    try:
        return Facts.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        place = ".".join(str(p) for p in first["loc"]) or "<root>"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise SnapshotError(f"{origin}: {place}: {first['msg']}{more}") from None


def load_snapshot(path: str | Path) -> Facts:
    """A saved snapshot (``-`` is stdin), read within size, time, depth and number caps."""
    from probes.untrusted import InputError, display_name, load_json, read_bytes

    name = display_name(str(path))
    try:
        data = load_json(read_bytes(path), name)
    except InputError as exc:
        raise SnapshotError(str(exc).replace("not JSON: binary data", "not a snapshot: binary data")) from None
    return facts_from_dict(data, name)


def dump_snapshot(facts: Facts) -> str:
    """The snapshot as JSON, with every credential redacted: saved files get pasted into issues."""
    from probes.redact import scrub

    return facts_from_dict(scrub(facts.model_dump(mode="json", warnings=False))).model_dump_json(indent=2)
