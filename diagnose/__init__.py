"""lightning-diagnose: rule-driven diagnosis of multi-GPU and distributed training failures.

The library API, all of it usable without torch::

    import diagnose
    facts = diagnose.collect_facts()                 # live probes of this machine
    facts = diagnose.load_snapshot("facts.json")     # or a saved snapshot
    facts = diagnose.offline_facts(report=env_text, log=log_text)   # or a user's paste
    kb = diagnose.load_kb(["my_rules/"])              # shipped rules plus your folders
    report = diagnose.evaluate(facts, kb)
    print(diagnose.render(report, "markdown"))       # text, json, markdown

``diagnose.diagnose_text(report=..., log=...)`` does the offline path in one call. Heavy
modules are imported only inside the functions that need them: ``import diagnose`` never
imports torch, lightning, textual or pynvml.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Facts",
    "KB",
    "KBError",
    "Report",
    "SnapshotError",
    "__version__",
    "collect_facts",
    "diagnose_text",
    "evaluate",
    "load_kb",
    "load_snapshot",
    "offline_facts",
    "render",
]

if TYPE_CHECKING:
    from diagnose.kb import KB, KBError
    from diagnose.report import Report
    from probes.facts import Facts
    from probes.snapshot import SnapshotError

_LAZY = {
    "Facts": ("probes.facts", "Facts"),
    "SnapshotError": ("probes.snapshot", "SnapshotError"),
    "load_snapshot": ("probes.snapshot", "load_snapshot"),
    "KB": ("diagnose.kb", "KB"),
    "KBError": ("diagnose.kb", "KBError"),
    "load_kb": ("diagnose.kb", "load_kb"),
    "Report": ("diagnose.report", "Report"),
    "evaluate": ("diagnose.engine", "evaluate"),
    "render": ("diagnose.render", "render"),
    "collect_facts": ("diagnose.api", "collect_facts"),
    "offline_facts": ("diagnose.api", "offline_facts"),
    "diagnose_text": ("diagnose.api", "diagnose_text"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'diagnose' has no attribute {name!r}")
