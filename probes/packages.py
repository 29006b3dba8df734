"""The ``packages`` section: every installed distribution's version, without importing any.

Importing torch or lightning to ask for ``__version__`` costs seconds and can crash on a
broken install; the installed metadata answers the same question in milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import metadata

from probes.facts import Packages, canonical_package


def probe(distributions: Iterable[metadata.Distribution] | None = None) -> Packages:
    """All distributions visible to this interpreter, keyed by PEP 503 name.

    When a name is installed twice the first one on ``sys.path`` wins, as it does for
    ``import``.
    """
    found = metadata.distributions() if distributions is None else distributions
    values: dict[str, str] = {}
    for dist in found:
        name = dist.metadata["Name"]
        if not name:  # a broken .dist-info without METADATA
            continue
        values.setdefault(canonical_package(name), dist.version)
    return Packages(source="live", values=values, complete=True)
