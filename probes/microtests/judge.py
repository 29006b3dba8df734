"""The one judge of a micro-test: what the ranks reported becomes a ``MicroTest``.

Two callers hand it the same inputs: the local runner (ranks it started itself, their
channels read back as ``RankReport``) and the cluster run (the ranks of the user's job,
whose results come through the job's store). Each says first how the run went as it saw the
processes (the status and the first error in time); the judge adds the measurements and the
verdicts the measurements imply, so a fact path such as
``microtests.rendezvous.measurements.error_kind`` means the same on both paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from probes.facts import MicroTest
from probes.microtests.channel import RankReport
from probes.microtests.checks import SIZES, size_label
from probes.microtests.errors import rendezvous_error_kind


def bandwidth(size: int, seconds: float, nranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9), as nccl-tests defines them for all_reduce."""
    algbw = size / seconds / 1e9
    return algbw, algbw * 2 * (nranks - 1) / nranks


def judge(
    name: str,
    reports: Mapping[int, RankReport],
    *,
    status: str,
    error: str | None,
    nproc: int,
    backend: str | None,
    duration_s: float | None,
    ranks: dict[str, str],
    launcher: RankReport | None = None,
    extra: Mapping[str, Any] | None = None,
) -> MicroTest:
    """``reports``: one per rank of the run, empty for a rank that wrote nothing."""
    extra = extra or {}
    measurements = measure(name, reports, nproc, status, error, launcher=launcher, extra=extra)
    if status == "passed" and measurements.get("ranks_on_foreign_device"):
        status = "failed"
        error = f"ranks {measurements['foreign_device_ranks']} hold memory on a GPU not their own"
    if status == "passed" and measurements.get("duplicates"):
        status, error = "failed", f"ranks {measurements['duplicate_ranks']} were given the same GPU"
    if status == "passed" and name == "lightning_fit":
        unfinished = [str(r) for r, report in reports.items() if "fit done" not in report.steps]
        if unfinished:
            status, error = "failed", f"ranks {','.join(unfinished)} never finished Trainer.fit"
        elif measurements.get("loss_finite") is False:
            status, error = "failed", "the training loss is not finite"
    if status == "timed_out" and name == "barrier" and measurements.get("missing_ranks"):
        error = f"ranks never reached the barrier: {measurements['missing_ranks']}; {error}"
    return MicroTest(
        status=status,
        duration_s=duration_s,
        backend=backend,
        nproc=nproc,
        error=error,
        ranks=ranks,
        measurements=measurements,
    )


def measure(
    name: str,
    reports: Mapping[int, RankReport],
    nproc: int,
    status: str,
    error: str | None = None,
    *,
    launcher: RankReport | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict:
    values = list(reports.values())
    if name == "rendezvous":
        out = _max_of(values, "init_s", "first_collective_s")
        if status != "passed":
            said = [r.error or "" for r in values] + [error or ""]
            out["error_kind"] = rendezvous_error_kind(" ".join(said))
        return out
    if name == "barrier":
        return {**_max_of(values, "barrier_s"), **_missing(reports, nproc, status)}
    if name == "all_reduce":
        return _all_reduce(values, nproc)
    if name == "placement":
        return dict(reports[0].measurements) if 0 in reports else {}
    if name == "duplicate_gpu":
        return _duplicates(reports, shared=bool((extra or {}).get("shared")))
    measured = dict(launcher.measurements) if launcher else {}
    measured.update(reports[0].measurements if 0 in reports else {})
    return {"strategy": (extra or {}).get("strategy"), **measured}


def _max_of(reports: list[RankReport], *keys: str) -> dict:
    out = {}
    for key in keys:
        values = [r.measurements[key] for r in reports if isinstance(r.measurements.get(key), (int, float))]
        if values:
            out[key] = max(values)
    return out


def _missing(reports: Mapping[int, RankReport], nproc: int, status: str) -> dict:
    if status == "passed":
        return {"missing_ranks": "", "missing_count": 0, "arrived_count": nproc}
    named = sorted({m for r in reports.values() for m in r.missing})
    # Without a monitored barrier's word, a rank that never entered the barrier is missing.
    missing = named or [rank for rank, r in reports.items() if "barrier" not in r.steps]
    return {
        "missing_ranks": ",".join(map(str, missing)),
        "missing_count": len(missing),
        "arrived_count": nproc - len(missing),
    }


def _all_reduce(reports: list[RankReport], nproc: int) -> dict:
    wrong = any(r.checks_failed for r in reports)
    finished = bool(reports) and all(r.done for r in reports)
    out: dict = {"correct": False if wrong else (True if finished else None), "dtype": "float32"}
    algbws, busbws = [], []
    for size in SIZES:
        label = size_label(size)
        times = [r.measurements.get(f"time_s_{label}") for r in reports]
        if not times or None in times:
            continue
        seconds = sum(times) / len(times)  # nccl-tests' default: the mean over ranks
        algbw, busbw = bandwidth(size, seconds, nproc)
        out[f"time_us_{label}"] = round(seconds * 1e6, 1)
        out[f"algbw_gbps_{label}"] = round(algbw, 4)
        algbws.append(algbw)
        # One rank moves nothing over a bus: nccl-tests print its busbw as 0, which a reader
        # (and a rule's "under 1 GB/s") would take for a link that crawls, so none is recorded.
        if nproc > 1:
            out[f"busbw_gbps_{label}"] = round(busbw, 4)
            busbws.append(busbw)
    if algbws:
        out["algbw_gbps_max"] = round(max(algbws), 4)
    if busbws:
        out["busbw_gbps_max"] = round(max(busbws), 4)
        out["busbw_gbps_avg"] = round(sum(busbws) / len(busbws), 4)
    return out


def _duplicates(reports: Mapping[int, RankReport], *, shared: bool) -> dict:
    if shared:
        errors = [r.measurements["nccl_error"] for r in reports.values() if r.measurements.get("nccl_error")]
        return {
            "mode": "shared",
            "nccl_error": errors[0] if errors else None,
            "nccl_rejects_shared": bool(errors) and any("duplicate gpu" in e.lower() for e in errors),
        }
    by_device: dict[str, list[int]] = {}
    for rank, report in reports.items():
        uuid = report.measurements.get("device_uuid")
        if uuid:
            by_device.setdefault(uuid, []).append(rank)
    if sum(map(len, by_device.values())) < len(reports):
        return {"mode": "distinct"}  # some rank never said which device it got
    shared_ranks = sorted(r for ranks in by_device.values() if len(ranks) > 1 for r in ranks)
    return {
        "mode": "distinct",
        "distinct_devices": len(by_device),
        "duplicates": bool(shared_ranks),
        "duplicate_ranks": ",".join(map(str, shared_ranks)),
    }
