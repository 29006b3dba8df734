"""The library entry points that gather facts; they call into probes/ lazily."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from diagnose.kb import KB
    from diagnose.report import Report
    from probes.facts import Facts

Progress = Callable[[str, str, "str | None"], None]


def collect_facts(
    *,
    microtests: Sequence[str] | None = (),
    nproc: int | None = None,
    backend: str | None = None,
    timeout: float = 60.0,
    strategy: str = "ddp",
    progress: Progress | None = None,
) -> Facts:
    """Probe this machine; run the named micro-tests (None: all, empty: none)."""
    from probes.collect import collect

    facts = collect(progress=progress)
    if microtests is None or microtests:
        from probes.microtests import run_microtests

        facts.microtests = run_microtests(
            None if microtests is None else list(microtests),
            nproc=nproc,
            backend=backend,
            timeout=timeout,
            strategy=strategy,
            progress=progress,
        )
    else:
        from probes.facts import Skipped

        facts.skipped.append(Skipped(what="micro-tests", reason="not requested (--microtests none)"))
    return facts


def offline_facts(
    report: str | None = None,
    log: str | None = None,
    *,
    reports: Iterable[tuple[str, str]] = (),
    logs: Iterable[tuple[str, object]] = (),
    kb: KB | None = None,
) -> Facts:
    """Facts from someone else's texts: a pasted environment report and a log or traceback.

    ``report``/``log`` take the texts directly; ``reports``/``logs`` take (name, text) and
    (name, path-or-text-stream) pairs when there are several. A long log keeps every line
    a rule of ``kb`` (the shipped rules by default) could match.
    """
    import io

    from probes.offline import offline_facts as build

    all_reports = list(reports) + ([("report", report)] if report else [])
    all_logs = list(logs) + ([("log", io.StringIO(log))] if log else [])
    if kb is None:
        from diagnose.kb import load_kb

        kb = load_kb()
    return build(reports=all_reports, logs=all_logs, keep=kb.log_literals)


def diagnose_text(
    report: str | None = None, log: str | None = None, *, kb: KB | None = None, extra_kb: Sequence[str | Path] = ()
) -> Report:
    """One call for support tooling: texts in, ranked Report out. No torch, no GPU needed."""
    from diagnose.engine import evaluate
    from diagnose.kb import load_kb

    kb = kb or load_kb(extra_kb)
    return evaluate(offline_facts(report, log, kb=kb), kb)
