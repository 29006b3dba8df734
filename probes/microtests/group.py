"""Several micro-tests in one launch of ranks; the parent side, which never imports torch.

Starting ranks costs an interpreter and an ``import torch`` each time, far more than the
micro-tests themselves, so the tests that share a world size run as the steps of one group:
the processes import torch once, answer what they found (the plan depends on it: NCCL or
gloo, how many GPUs), get the plan, and run the steps in order. Each step keeps its own hard
deadline, counted from when its first rank entered it, and is judged on its own: the parent
sees which step every rank reached from the step's channel files. The first failure (a rank
that fails, or a step past its deadline) ends the group as it ends a single test: a grace for
the other ranks to report, then the whole tree is killed. The steps before it stand, the
failing one is judged from what its ranks wrote and how they ended, and the caller starts a
new group for the steps after it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from probes.microtests.channel import (
    PLAN,
    RankReport,
    answer_path,
    channel_path,
    exit_path,
    read_report,
    read_whole,
    write_whole,
)
from probes.microtests.watchdog import POLL_S, Ended, Launch, Watchdog, Watched, who

_GRACE_S = 1.0


@dataclass
class Run:
    """One execution of a test: how its processes ended and what each rank wrote."""

    watched: Watched
    reports: dict[int, RankReport]
    launcher: RankReport | None
    nproc: int
    backend: str
    timeout: float
    extra: dict = field(default_factory=dict)

    def exit_of(self, rank: int):
        return self.watched.exits.get(rank) or self.watched.exits.get("launcher")


@dataclass
class Step:
    test: str
    port: int
    devices: list[str]  # one per rank: cpu or cuda:N
    mode: str = "distinct"  # duplicate_gpu: distinct | shared


@dataclass
class GroupPlan:
    world_size: int  # 0: nothing to run, the processes only answered
    backend: str
    strategy: str
    timeout: float
    steps: list[Step]


def run_group(
    plan: GroupPlan | Callable[[dict], GroupPlan],
    *,
    workers: int,
    answer_limit: float,
    env: dict[str, str],
    on_start: Callable[[str], None],
    on_result: Callable[[str, Run], None],
) -> dict:
    """Start ``workers`` processes (one where rank 0 may fork the others, as it does when the
    steps run on CPU and it found no GPU; more are started if it cannot) and run the plan:
    given, or made from the first answer, which is returned (``{"query_error": why}`` when
    none came).

    ``on_start(test)`` and ``on_result(test, run)`` are called in the steps' order, as the
    group reaches a step and once it is over: the steps before a failure while the group
    still runs.
    """
    with tempfile.TemporaryDirectory(prefix="diagnose-microtest-") as work:
        group = _Group(Path(work), env, answer_limit)
        try:
            return group.run(plan, workers, on_start, on_result)
        finally:
            group.dog.close()


class _Group:
    def __init__(self, work: Path, env: dict[str, str], answer_limit: float) -> None:
        self.work = work
        self.env = env
        self.limit = answer_limit
        self.dog = Watchdog(work)
        self.started = 0

    def _start(self, count: int) -> None:
        # The processes wait for the plan at most this long: two answer limits, as the parent
        # may wait one for the first answer and one more for processes it adds.
        deadline = time.time() + 2 * self.limit
        for index in range(self.started, count):
            argv = [
                sys.executable, "-m", "probes.microtests.worker", "--group",
                "--index", str(index), "--out", str(self.work), "--parent-pid", str(os.getpid()),
                "--deadline", repr(deadline),
            ]  # fmt: skip
            self.dog.launch(Launch(index, argv, self.env))
        self.started = max(self.started, count)

    def _answers(self, count: int) -> tuple[dict[int, dict], str | None]:
        """Answers of processes 0..count-1: all, or those in before one ended or time ran out."""
        answers: dict[int, dict] = {}
        until = time.monotonic() + self.limit
        while True:
            self.dog.poll()
            for index in range(count):
                if index not in answers and (said := read_whole(answer_path(self.work, index))):
                    answers[index] = said
            if len(answers) == count:
                return answers, None
            if silent := [k for k in self.dog.exits if k not in answers]:
                return (
                    answers,
                    f"inspecting torch in {sys.executable} failed: {self._said(silent[0])}",
                )
            if time.monotonic() >= until:
                return answers, f"inspecting torch in {sys.executable} took over {self.limit:g} s"
            time.sleep(POLL_S)

    def _said(self, key: int | str) -> str:
        lines = [line for line in self.dog.tail(key).splitlines() if line.strip()]
        ended = self.dog.exits[key].describe()
        return f"{ended}: {lines[-1].strip()}" if lines else ended

    def run(self, plan, workers, on_start, on_result) -> dict:
        self._start(workers)
        if isinstance(plan, GroupPlan):
            answers, _ = self._answers(workers)
        else:
            answers, error = self._answers(1)
            if not answers:
                return {"query_error": error}
            plan = plan(next(iter(answers.values())))
        info = next(iter(answers.values()), {})
        fork = forks(self.started, plan, info)
        if not fork and plan.world_size > self.started:
            self._start(plan.world_size)
            answers, _ = self._answers(plan.world_size)
        # A process that never answered fails the first step: its exit or its deadline says why.
        write_whole(self.work / PLAN, asdict(plan) | {"fork": fork})
        if plan.world_size:
            if fork:
                for rank in range(1, plan.world_size):
                    self.dog.adopt(rank, self.work / f"{rank}.log")
            self._steps(plan, on_start, on_result)
        return info

    def _steps(self, plan: GroupPlan, on_start, on_result) -> None:
        ranks = range(plan.world_size)
        dirs = [self.work / step.test for step in plan.steps]
        entered = dict.fromkeys(ranks, 0)  # how many steps each rank has entered
        started: dict[int, float] = {}
        imports_from = time.monotonic()
        on_start(plan.steps[0].test)
        current, deadline_hit = 0, False
        while True:
            for rank in ranks:
                said = read_whole(exit_path(self.work, rank))
                if said is not None:
                    self.dog.exited(rank, said)
            self.dog.poll()
            for rank in ranks:
                while entered[rank] < len(dirs) and channel_path(dirs[entered[rank]], rank).exists():
                    started.setdefault(entered[rank], time.monotonic())
                    entered[rank] += 1
            # A rank enters the next step only after it recorded this one done.
            while current + 1 < len(dirs) and all(entered[r] > current + 1 for r in ranks):
                watched = Watched(
                    exits={r: Ended(0) for r in ranks},
                    deadline_hit=False,
                    failed_first=[],
                    elapsed_s=time.monotonic() - started[current],
                )
                on_result(plan.steps[current].test, self._run(plan, current, watched))
                current += 1
                # Announced once the step before it has its result, so progress reads in order.
                on_start(plan.steps[current].test)
            if self.dog.ended:
                break
            # Before the first step, the ranks are still importing: the answer limit applies.
            limit = plan.timeout if current in started else self.limit
            if time.monotonic() >= started.get(current, imports_from) + limit:
                deadline_hit = True
                self.dog.stop(f"at the {limit:g} s deadline")
                break
            if self.dog.grace_over(_GRACE_S):
                self.dog.stop(f"after {who(self.dog.failed_first[0])} failed")
                break
            time.sleep(POLL_S)
        self.dog.close()
        # The step the group ended in: the last one, or the one that failed or hung.
        watched = self.dog.watched(deadline_hit, since=started.get(current))
        watched.exits = {k: e for k, e in watched.exits.items() if k in ranks}
        watched.failed_first = [k for k in watched.failed_first if k in ranks]
        on_result(plan.steps[current].test, self._run(plan, current, watched))

    def _run(self, plan: GroupPlan, number: int, watched: Watched) -> Run:
        step = plan.steps[number]
        reports = {r: read_report(self.work / step.test, r) for r in range(plan.world_size)}
        extra = {"shared": step.mode == "shared", "strategy": plan.strategy}
        return Run(watched, reports, None, plan.world_size, plan.backend, plan.timeout, extra)


def forks(started: int, plan: GroupPlan, info: dict) -> bool:
    """Whether rank 0 grows the other ranks by fork, which spares each of them importing torch
    and Lightning again: where it is the only process so far, fork exists, every step runs on
    CPU and rank 0 found no GPU (CUDA does not survive a fork)."""
    return (
        started == 1
        and plan.world_size > 1
        and hasattr(os, "fork")
        and all(device == "cpu" for step in plan.steps for device in step.devices)
        and not info.get("cuda")
    )
