"""Helpers shared by the test packages."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pythonpath(*first: str | Path) -> str:
    """A child process's PYTHONPATH: ``first``, then the suite's own entries less this checkout.

    Where a cluster's environment modules (or packages carried to a machine without an index)
    put the dependencies on PYTHONPATH, a child given only ``first`` could not import pydantic.
    """
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    return os.pathsep.join([*map(str, first), *inherited])
