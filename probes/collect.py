"""Gather every live probe into one Facts snapshot.

The torch child is the slow part (importing torch, then CUDA init), so it starts first in
a thread and the in-process probes run while it works. Each probe is isolated: one that
raises becomes a ``ProbeError`` and the rest still run. NVML runs in this process, where
a wedged driver can block a call for minutes, so it gets a deadline of its own and is
abandoned, not waited for, past it.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

from probes import env, gpus, host, launcher, packages, runner, torch_build
from probes.facts import Driver, Facts, Gpus, ProbeError, Skipped

# step name, state (running, passed, failed, skipped), detail
Progress = Callable[[str, str, "str | None"], None]

STEPS = ("torch", "host", "packages", "env", "gpus", "launcher")


def collect(
    *,
    torch_timeout: float = 20.0,
    nvml_timeout: float = 10.0,
    progress: Progress | None = None,
    environ: Mapping[str, str] | None = None,
    nvml: Any = None,
    run: runner.Runner = runner.run,
    python: Sequence[str] = (sys.executable,),
) -> Facts:
    """The live snapshot of this machine.

    ``progress`` is called from the caller's thread. ``environ``, ``nvml``, ``run`` and
    ``python`` stand in for the real environment, NVML, runner and interpreter in tests.
    """
    report = progress or (lambda step, state, detail: None)
    environ = dict(os.environ) if environ is None else environ
    facts = Facts(created=datetime.now(timezone.utc).isoformat(timespec="seconds"), inputs=["live"])

    def step(name: str, fn: Callable[[], Any]) -> Any:
        report(name, "running", None)
        try:
            value = fn()
        except Exception as exc:  # a probe bug must not cost the other sections
            facts.errors.append(ProbeError(probe=name, message=f"{type(exc).__name__}: {exc}"))
            report(name, "failed", str(exc))
            return None
        return value

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="diagnose-torch") as pool:
        report("torch", "running", None)
        torch_future = pool.submit(torch_build.probe, run, torch_timeout, python)

        found = step("host", lambda: host.probe(environ=environ))
        if found is not None:
            facts.host = found
            report("host", "passed", _host_detail(facts))

        found = step("packages", packages.probe)
        if found is not None:
            facts.packages = found
            report("packages", "passed", f"{len(found.values)} installed")

        found = step("env", lambda: env.probe(environ))
        if found is not None:
            facts.env = found
            report("env", "passed", f"{len(found.values)} relevant variables")

        found = step("gpus", lambda: _nvml_in_time(nvml, environ, nvml_timeout))
        if found is not None:
            facts.gpus, facts.driver = found
            _report_gpus(facts, report)

        found = step("launcher", lambda: launcher.probe(environ, interactive=facts.host.interactive))
        if found is not None:
            facts.launcher = found
            report("launcher", "passed", found.kind)

        try:
            facts.torch = torch_future.result()
        except Exception as exc:
            facts.errors.append(ProbeError(probe="torch", message=f"{type(exc).__name__}: {exc}"))
            report("torch", "failed", str(exc))
        else:
            _report_torch(facts, report)
    return facts


def _nvml_in_time(nvml: Any, environ: Mapping[str, str], timeout: float) -> tuple[Gpus, Driver]:
    answer: list[Any] = []

    def ask() -> None:
        try:
            answer.append(gpus.probe(nvml, environ=environ))
        except Exception as exc:
            answer.append(exc)

    # a daemon thread, so a call that never returns does not hold up the exit either
    worker = threading.Thread(target=ask, name="diagnose-nvml", daemon=True)
    worker.start()
    worker.join(timeout)
    if not answer:
        return gpus.unanswered(f"NVML did not answer within {timeout:g} s: the driver may be hung", environ)
    if isinstance(answer[0], Exception):
        raise answer[0]
    return answer[0]


def _host_detail(facts: Facts) -> str:
    shm = facts.host.shm_total_bytes
    return f"{facts.host.os}, /dev/shm {shm / 2**20:.0f} MiB" if shm is not None else f"{facts.host.os}"


def _report_gpus(facts: Facts, report: Progress) -> None:
    reason = facts.gpus.unavailable.get("devices")
    if facts.gpus.devices is None:
        on_bus = "" if facts.gpus.count is None else f"{facts.gpus.count} NVIDIA GPU(s) on the PCI bus; "
        facts.skipped.append(Skipped(what="gpus", reason=on_bus + (reason or "unknown")))
        report("gpus", "skipped" if reason and reason.startswith(gpus.NO_NVML) else "failed", on_bus + (reason or ""))
        return
    report("gpus", "passed", f"{facts.gpus.count} GPU(s), driver {facts.driver.version}")


def _report_torch(facts: Facts, report: Progress) -> None:
    t = facts.torch
    if t.version is None:
        reason = t.init_error or t.unavailable.get("version", "unknown")
        facts.skipped.append(Skipped(what="torch", reason=reason))
        report("torch", "skipped" if t.init_error is None else "failed", reason)
        return
    build = f"CUDA {t.cuda} build" if t.cuda else ("ROCm build" if t.hip else "CPU build")
    if t.init_error:
        report("torch", "failed", f"{t.version} {build}; {t.init_error}")
    else:
        report("torch", "passed", f"{t.version} {build}, {t.device_count} device(s) visible")
