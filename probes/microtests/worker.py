"""The entry point of the ranks: ``python -m probes.microtests.worker``.

Only child processes run this module; it is where torch gets imported. Two ways in:

``--group --index I``
    One process of a group that runs several micro-tests in sequence, so torch is imported
    once for all of them. It imports torch, writes what the parent needs to plan the run
    (torch, CUDA, backends, Lightning) to ``answers/I.json``, then waits for ``plan.json``:
    the world size (an index past it just exits), the backend, and the steps, each with its
    port and this rank's device. With ``fork`` in the plan (every step on CPU, no GPU found)
    only process 0 was started: it imports what the steps need, forks ranks 1.. and reports
    their exits to ``exits/<R>.json``. Each step writes to its own channel,
    ``<test>/rank<R>.jsonl``, so the parent knows which step every rank reached; a step that
    raises ends the process, and the parent starts a new group for the steps after it.
``--test NAME --rank R ...``
    One rank (or, without ``--rank``, the launcher Lightning's spawn strategy grows) of one
    micro-test, for the launches that cannot share a group: NCCL variants, two ranks sharing
    one GPU, ddp_spawn.

Test-only fault injection: with ``DIAGNOSE_MICROTEST_TESTING=1`` set, the worker honours
``DIAGNOSE_MICROTEST_FAULT=TEST:RANK:ACTION`` (actions: ``skip_barrier``: that rank never
arrives at the barrier; ``kill``: it dies at once, killed by a signal, once its process group is up;
``wrong_sum``: it contributes a wrong value to the all_reduce). Without the first variable the
second is ignored, so a stray setting cannot break a real diagnosis.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib.util
import os
import sys
import threading
import time
from pathlib import Path

from probes.microtests import checks
from probes.microtests.channel import (
    PLAN,
    Channel,
    answer_path,
    exit_path,
    read_whole,
    write_whole,
)
from probes.microtests.errors import classify

# How long past its deadline a rank whose watchdog is gone ends itself.
_SELF_DESTRUCT_AFTER_S = 10.0
_PLAN_POLL_S = 0.01
# A failing rank 0 first gives the ranks it forked this long to have their exits reported:
# a rank that died (and so made rank 0 fail) must be the failure the parent sees first.
_REPORT_WAIT_S = 0.3
_reporters: list[threading.Thread] = []  # in rank 0: one per forked rank


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


class _Guard(threading.Thread):
    """The rank's own backstop for a watchdog that is itself gone (the parent killed).

    Past a step's deadline the watchdog kills the rank; if the parent has died or the deadline
    is long gone, the rank ends itself, so no rank outlives a run for long. A group moves
    ``deadline`` on at every step.
    """

    def __init__(self, parent_pid: int, deadline: float) -> None:
        super().__init__(daemon=True, name="orphan-guard")
        self.parent_pid = parent_pid
        self.deadline = deadline
        self.start()

    def run(self) -> None:
        while os.getppid() == self.parent_pid and time.time() < self.deadline + _SELF_DESTRUCT_AFTER_S:
            time.sleep(0.5)
        os._exit(70)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m probes.microtests.worker")
    parser.add_argument("--group", action="store_true")
    parser.add_argument("--index", type=int)  # a group's process: its rank, if the plan needs it
    parser.add_argument("--test")
    parser.add_argument("--rank", type=int)  # absent for a launcher that starts the ranks
    parser.add_argument("--world-size", type=int)
    parser.add_argument("--device", default="cpu")  # cpu or cuda:N
    parser.add_argument("--backend")
    parser.add_argument("--port", type=int)
    parser.add_argument("--deadline", type=float)  # wall-clock epoch seconds
    parser.add_argument("--out")
    parser.add_argument("--parent-pid", type=int)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--mode", default="distinct")  # duplicate_gpu: distinct | shared
    return parser.parse_args(argv)


def _run_step(ctx: checks.Context) -> None:
    """Run one micro-test's body; an exception is reported and ends the process."""
    ctx.channel.step("started")
    try:
        if ctx.test == "lightning_fit":
            from probes.microtests.fit import fit

            fit(ctx)
        else:
            getattr(checks, ctx.test)(ctx)
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        timeout, missing = classify(text)
        ctx.channel.error(text, timeout=timeout, missing=missing)
        until = time.monotonic() + _REPORT_WAIT_S
        for reporter in _reporters:
            reporter.join(max(0.0, until - time.monotonic()))
        # After a failed collective, an orderly teardown can hang on the broken group.
        sys.stderr.flush()
        os._exit(1)
    ctx.channel.done()


def _wait_for_plan(out: str, deadline: float) -> dict | None:
    path = Path(out) / PLAN
    while time.time() < deadline:
        plan = read_whole(path)
        if plan is not None:
            return plan
        time.sleep(_PLAN_POLL_S)
    return None


def _fork_ranks(out: str, world_size: int) -> int:
    """Grow ranks 1.. from this process, which has imported all they need; the rank this
    process now is. Rank 0 starts a thread per child that reports its exit to the parent."""
    sys.stdout.flush()
    sys.stderr.flush()
    for rank in range(1, world_size):
        pid = os.fork()
        if pid == 0:
            # Its own output, so the parent reads each rank's last words apart.
            log = os.open(Path(out) / f"{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(log)
            _reporters.clear()
            return rank
        reporter = threading.Thread(target=_report_exit, args=(out, rank, pid), daemon=True)
        reporter.start()
        _reporters.append(reporter)
    return 0


def _report_exit(out: str, rank: int, pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    write_whole(exit_path(out, rank), os.waitstatus_to_exitcode(status))


def _group(args: argparse.Namespace) -> None:
    guard = _Guard(args.parent_pid, args.deadline)
    write_whole(answer_path(args.out, args.index), query())
    plan = _wait_for_plan(args.out, args.deadline)
    if plan is None or args.index >= plan["world_size"]:
        return
    rank = args.index
    if plan["fork"]:
        if any(step["test"] == "lightning_fit" for step in plan["steps"]):
            # Once here, not once per rank. A Lightning that fails to import is the
            # lightning_fit step's failure, reported when that step imports it again.
            with contextlib.suppress(Exception):
                import probes.microtests.fit  # noqa: F401
        rank = _fork_ranks(args.out, plan["world_size"])
        if rank:
            guard = _Guard(os.getppid(), args.deadline)
    for step in plan["steps"]:
        deadline = time.time() + plan["timeout"]
        guard.deadline = deadline
        out = Path(args.out) / step["test"]
        out.mkdir(exist_ok=True)
        _run_step(
            checks.Context(
                test=step["test"],
                rank=rank,
                world_size=plan["world_size"],
                device=step["devices"][rank],
                backend=plan["backend"],
                port=step["port"],
                deadline=deadline,
                out=str(out),
                channel=Channel(out, rank),
                fault=planted_fault(step["test"], rank),
                strategy=plan["strategy"],
                mode=step["mode"],
            )
        )
    for reporter in _reporters:  # the parent learns a forked rank's exit only from here
        reporter.join()


def _single(args: argparse.Namespace) -> None:
    _Guard(args.parent_pid, args.deadline)
    _run_step(
        checks.Context(
            test=args.test,
            rank=args.rank,
            world_size=args.world_size,
            device=args.device,
            backend=args.backend,
            port=args.port,
            deadline=args.deadline,
            out=args.out,
            channel=Channel(args.out, "launcher" if args.rank is None else args.rank),
            fault=planted_fault(args.test, args.rank),
            strategy=args.strategy,
            mode=args.mode,
        )
    )


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # A rank that crashes (SIGSEGV, SIGABRT from NCCL's watchdog) leaves its Python stack.
    faulthandler.enable()
    (_group if args.group else _single)(args)
    # The results are recorded. Skip interpreter teardown: Lightning's atexit handler destroys
    # the process group, and on gloo that can abort (SIGABRT) once the peer rank has already gone.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
