"""The ``host`` section: OS, CPUs, memory, /dev/shm, container and locked-memory limit."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import psutil

from probes.facts import Host

SHM = "/dev/shm"

# Markers a process inside Jupyter/IPython/Colab inherits or can see in its ancestors.
_NOTEBOOK_ENV = ("JPY_PARENT_PID", "COLAB_RELEASE_TAG", "COLAB_GPU", "KAGGLE_KERNEL_RUN_TYPE")
_NOTEBOOK_CMD = ("ipykernel", "jupyter", "colab_kernel_launcher", "ipython")


def probe(
    *,
    root: Path = Path("/"),
    environ: Mapping[str, str] | None = None,
    ancestors: Callable[[], Iterable[str]] | None = None,
) -> Host:
    """``root`` stands in for ``/`` in tests; the container and shm files are read under it."""
    environ = os.environ if environ is None else environ
    host = Host(source="live", platform=sys.platform, python=platform.python_version())
    host.kernel = platform.release() or None
    host.os = _os_name(root)
    host.cpu_count = _cpu_count()
    mem = psutil.virtual_memory()
    host.memory_total_bytes = mem.total
    host.memory_available_bytes = mem.available
    _shm(host, root / SHM.lstrip("/"))
    host.container = detect_container(root, environ)
    host.memlock_limit_bytes = _memlock(host)
    host.interactive = detect_interactive(environ, _ancestor_cmdlines if ancestors is None else ancestors)
    return host


def _os_name(root: Path) -> str | None:
    for rel in ("etc/os-release", "usr/lib/os-release"):
        try:
            text = (root / rel).read_text()
        except OSError:
            continue
        fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
        pretty = fields.get("PRETTY_NAME") or fields.get("NAME")
        if pretty:
            return pretty.strip().strip('"')
    return platform.platform(terse=True) or None


def _cpu_count() -> int | None:
    # The CPUs this process may run on (taskset, cgroup cpusets), not the machine's total:
    # DataLoader workers and OMP threads are sized against these.
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _shm(host: Host, path: Path) -> None:
    try:
        usage = os.statvfs(path)
    except OSError as exc:
        reason = f"{path}: {exc.strerror or exc}"
        host.unavailable["shm_total_bytes"] = reason
        host.unavailable["shm_free_bytes"] = reason
        return
    host.shm_total_bytes = usage.f_blocks * usage.f_frsize
    host.shm_free_bytes = usage.f_bavail * usage.f_frsize


def detect_container(root: Path, environ: Mapping[str, str]) -> str:
    if "KUBERNETES_SERVICE_HOST" in environ:
        return "kubernetes"
    if (root / ".dockerenv").exists():
        return "docker"
    if (root / "run/.containerenv").exists():
        return "podman"
    if environ.get("container"):  # systemd's convention: lxc, podman, docker, ...
        return environ["container"]
    try:
        cgroup = (root / "proc/1/cgroup").read_text()
    except OSError:
        cgroup = ""
    for marker, kind in (("kubepods", "kubernetes"), ("docker", "docker"), ("lxc", "lxc")):
        if marker in cgroup:
            return kind
    return "none"


def _memlock(host: Host) -> int | None:
    try:
        import resource
    except ImportError:  # Windows
        host.unavailable["memlock_limit_bytes"] = "no RLIMIT_MEMLOCK on this platform"
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return -1 if soft == resource.RLIM_INFINITY else soft


def detect_interactive(environ: Mapping[str, str], ancestors: Callable[[], Iterable[str]]) -> bool:
    """True inside a notebook kernel or IPython, or when started from one (``!diagnose``)."""
    # the same test Lightning uses to refuse strategies that cannot run in a notebook
    if hasattr(sys, "ps1") or sys.flags.interactive or "ipykernel" in sys.modules:
        return True
    if any(name in environ for name in _NOTEBOOK_ENV):
        return True
    return any(any(marker in cmd for marker in _NOTEBOOK_CMD) for cmd in ancestors())


def _ancestor_cmdlines() -> Iterable[str]:
    try:
        parents = psutil.Process().parents()
    except psutil.Error:
        return
    for proc in parents:
        try:
            yield " ".join(proc.cmdline())
        except psutil.Error:
            continue
