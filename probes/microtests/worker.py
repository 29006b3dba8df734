"""The entry point of one rank: ``python -m probes.microtests.worker --test NAME ...``.

Only child processes run this module; it is where torch gets imported. ``--query`` instead
prints, as JSON, what the parent needs to plan a run (torch, CUDA, backends, Lightning) without
importing torch itself.

Test-only fault injection: with ``DIAGNOSE_MICROTEST_TESTING=1`` set, the worker honours
``DIAGNOSE_MICROTEST_FAULT=TEST:RANK:ACTION`` (actions: ``skip_barrier``: that rank never
arrives at the barrier; ``kill``: it SIGKILLs itself once its process group is up;
``wrong_sum``: it contributes a wrong value to the all_reduce). Without the first variable the
second is ignored, so a stray setting cannot break a real diagnosis.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib.util
import json
import os
import re
import sys
import threading
import time

from probes.microtests import checks
from probes.microtests.channel import Channel

# Past its deadline the watchdog kills a rank; this is the rank's own backstop for a
# watchdog that is itself gone (the parent killed), so no rank outlives a run for long.
_SELF_DESTRUCT_AFTER_S = 10.0

_TIMEOUT = re.compile(
    r"timed? ?out|timeout|failed to pass monitoredBarrier|Watchdog caught collective", re.IGNORECASE
)
_MISSING = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")


def query() -> dict:
    """What the parent cannot learn without importing torch: versions, CUDA, backends."""
    info: dict = {
        "python": sys.executable,
        "lightning": any(importlib.util.find_spec(m) for m in ("lightning", "pytorch_lightning")),
        "deepspeed": importlib.util.find_spec("deepspeed") is not None,
    }
    try:
        import torch
        import torch.distributed as dist
    except Exception as exc:  # a broken torch is a finding, not a crash
        info["torch_error"] = f"{type(exc).__name__}: {exc}"
        return info
    info["torch"] = torch.__version__
    info["distributed"] = dist.is_available()
    info["gloo"] = info["distributed"] and dist.is_gloo_available()
    info["nccl"] = info["distributed"] and dist.is_nccl_available()
    info["cuda"] = torch.cuda.is_available()
    info["device_count"] = torch.cuda.device_count() if info["cuda"] else 0
    return info


def planted_fault(test: str, rank: int | None) -> str | None:
    """The action planted for this rank of this test, in test mode only."""
    if os.environ.get("DIAGNOSE_MICROTEST_TESTING") != "1":
        return None
    spec = os.environ.get("DIAGNOSE_MICROTEST_FAULT", "")
    parts = spec.split(":")
    if len(parts) == 3 and parts[0] == test and parts[1] == str(rank):
        return parts[2]
    return None


def classify(text: str) -> tuple[bool, list[int]]:
    """(is a timeout, the ranks a monitored barrier named as missing)."""
    missing = _MISSING.search(text)
    ranks = [int(r) for r in re.findall(r"\d+", missing.group(1))] if missing else []
    return bool(_TIMEOUT.search(text)), ranks


def _guard(parent_pid: int, deadline: float) -> None:
    def watch() -> None:
        while os.getppid() == parent_pid and time.time() < deadline + _SELF_DESTRUCT_AFTER_S:
            time.sleep(0.5)
        os._exit(70)

    threading.Thread(target=watch, daemon=True, name="orphan-guard").start()


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m probes.microtests.worker")
    parser.add_argument("--query", action="store_true")
    parser.add_argument("--test")
    parser.add_argument("--rank", type=int)  # absent for a launcher that starts the ranks
    parser.add_argument("--world-size", type=int)
    parser.add_argument("--local-rank", type=int)
    parser.add_argument("--device", default="cpu")  # cpu or cuda:N
    parser.add_argument("--backend")
    parser.add_argument("--port", type=int)
    parser.add_argument("--deadline", type=float)  # wall-clock epoch seconds
    parser.add_argument("--out")
    parser.add_argument("--parent-pid", type=int)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--mode", default="distinct")  # duplicate_gpu: distinct | shared
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.query:
        print(json.dumps(query()))
        return 0
    _guard(args.parent_pid, args.deadline)
    # A rank that crashes (SIGSEGV, SIGABRT from NCCL's watchdog) leaves its Python stack.
    faulthandler.enable()
    channel = Channel(args.out, "launcher" if args.rank is None else args.rank)
    channel.step("started")
    ctx = checks.Context(
        test=args.test,
        rank=args.rank,
        world_size=args.world_size,
        local_rank=args.local_rank,
        device=args.device,
        backend=args.backend,
        port=args.port,
        deadline=args.deadline,
        out=args.out,
        channel=channel,
        fault=planted_fault(args.test, args.rank),
        strategy=args.strategy,
        mode=args.mode,
    )
    try:
        if args.test == "lightning_fit":
            from probes.microtests.fit import fit

            fit(ctx)
        else:
            getattr(checks, args.test)(ctx)
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        timeout, missing = classify(text)
        channel.error(text, timeout=timeout, missing=missing)
        # After a failed collective, an orderly teardown can hang on the broken group.
        sys.stderr.flush()
        os._exit(1)
    channel.done()
    # The result is recorded. Skip interpreter teardown: Lightning's atexit handler destroys the
    # process group, and on gloo that can abort (SIGABRT) once the peer rank has already gone.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
