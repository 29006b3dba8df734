"""Structured facts from what a log's state lines and tracebacks say (``Log.nccl``,
``Log.failure``, ``Log.exit_codes``, ``Log.exit_signals``).

A matched line says one thing; a maintainer reads the lines together: NCCL printed its version
and bootstrap interface but never "Init COMPLETE" (init stalled: network), two processes of
one host report the same bus id (two ranks on one GPU), the launcher says a rank ended with
-9 (signal 9, as the host's OOM killer sends) or the first traceback ends in the user's own frame. These
facts come from the fields the signatures of ``kb/signatures/state.yaml`` and ``nccl.yaml``
extract, so a new wording is a signature, not code here.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable

from probes.facts import Failure, Log, NcclState
from probes.hang import first_failure

# A shell reports a child killed by signal N as exit status 128+N; Python's subprocess and
# torchrun report it as -N.
_SHELL_SIGNAL_BASE = 128
_MAX_LISTED = 16
_MAX_LINE = 300


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def _exit_signal(code: int) -> str | None:
    if code < 0:
        return _signal_name(-code)
    if _SHELL_SIGNAL_BASE < code < _SHELL_SIGNAL_BASE + 32:
        return _signal_name(code - _SHELL_SIGNAL_BASE)
    return None


def _ordered(values) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))[:_MAX_LISTED]


_LISTED_INTERFACE = re.compile(r"\[\d+\]([\w.-]+?)(?::|<|\s|$)")


def _interfaces(sigs) -> list[str]:
    """Every interface NCCL says it uses: the bootstrap one, and each one a NET line lists
    ("NET/Socket : Using [0]bond0:10.0.0.1<0> [1]docker0:172.17.0.1<0>")."""
    found: list[str] = []
    for sig in sigs:
        if sig.id == "nccl_bootstrap" and sig.data.get("interface"):
            found.append(sig.data["interface"])
        elif sig.id == "nccl_net":
            listed = _LISTED_INTERFACE.findall(sig.excerpt.split("OOB")[0])
            found.extend(listed or [sig.data.get("interface", "")])
    return found


def nccl_state(log: Log) -> NcclState | None:
    """What NCCL's own INFO lines say about init; None when the log holds none of them."""
    sigs = log.signatures or []
    by_id: dict[str, list[dict[str, str]]] = {}
    for sig in sigs:
        by_id.setdefault(sig.id, []).append(sig.data)
    init_ids = ("nccl_version", "nccl_bootstrap", "nccl_net", "nccl_comm_init", "nccl_init_complete", "nccl_transport")
    if not any(i in by_id for i in init_ids):
        return None
    inits = by_id.get("nccl_comm_init", [])
    # a device (host, bus id) opened by more than one process: two ranks on one GPU
    users: dict[str, set[str]] = {}
    for d in inits:
        if d.get("bus_id") and d.get("pid"):
            users.setdefault(f"{d.get('host', '?')}:{d['bus_id']}", set()).add(d["pid"])
    completed = "nccl_init_complete" in by_id or any(d.get("stage") == "COMPLETE" for d in inits)
    nranks = [int(d["nranks"]) for d in inits if d.get("nranks", "").isdigit()]
    hosts = _ordered(
        d.get("host")
        for i in ("nccl_version", "nccl_bootstrap", "nccl_net", "nccl_comm_init")
        for d in by_id.get(i, [])
    )
    last = next(
        (line.text for line in reversed(log.lines or []) if "NCCL INFO" in line.text or "NCCL WARN" in line.text), None
    )
    return NcclState(
        net=next((d["net"] for d in by_id.get("nccl_net", []) if d.get("net")), None),
        interfaces=_ordered(_interfaces(sigs)),
        transports=_ordered(d.get("transport") for d in by_id.get("nccl_transport", [])),
        init_completed=completed,
        nranks=max(nranks) if nranks else None,
        shared_devices=sorted(k for k, pids in users.items() if len(pids) > 1)[:_MAX_LISTED],
        hosts=hosts,
        last_line=last[:_MAX_LINE] if last else None,
    )


_VERSION_FIELDS = {
    "nccl_version": ("version",),
    "nccl_error": ("nccl_version",),
    "nccl_library_version": ("version",),
    "nccl_releases_compared": ("version", "other"),
}


def nccl_versions(log: Log) -> list[str] | None:
    """Every NCCL release the log names (x.y.z, build suffix dropped); None when it names none."""
    found = _ordered(
        sig.data.get(field, "").split("+")[0]
        for sig in log.signatures or []
        for field in _VERSION_FIELDS.get(sig.id, ())
    )
    # a release told by its minor only (2.18) is the same as a full one of that minor (2.18.1)
    return [v for v in found if not any(w.startswith(v + ".") for w in found)] or None


def exits(log: Log) -> tuple[list[int] | None, list[str] | None]:
    """(exit codes, signals) the launcher reported for ranks and child processes."""
    codes: list[int] = []
    names: list[str] = []
    for sig in log.signatures or []:
        if sig.id != "process_exit":
            continue
        code = sig.data.get("exitcode")
        if code is not None and code.lstrip("-").isdigit():
            codes.append(int(code))
            names.append(_exit_signal(int(code)) or "")
        signum = sig.data.get("signum")
        names.append(sig.data.get("signal") or (_signal_name(int(signum)) if signum and signum.isdigit() else "") or "")
    if not codes and not any(names):
        return None, None
    return list(dict.fromkeys(codes))[:_MAX_LISTED], _ordered(names)


def structure(log: Log, read: Callable[[str], Log]) -> Log:
    """``log`` with its structured facts filled in; ``read`` reads a traceback's text
    (``probes.log.log_from_text``) to name what its exception is."""
    root = next((s.data.get("first_failing_rank") for s in log.signatures or [] if s.id == "child_failed"), None)
    failure: Failure | None = None
    if log.lines:
        rank = int(root) if root and root.isdigit() else None
        failure = first_failure((line.text for line in log.lines), rank, read)
    codes, names = exits(log)
    return log.model_copy(
        update={
            "nccl": nccl_state(log),
            "nccl_versions": nccl_versions(log),
            "failure": failure,
            "exit_codes": codes,
            "exit_signals": names,
        }
    )
