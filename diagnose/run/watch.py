"""Watching a running job: output and the ranks' CPU and I/O as progress, and when it is hung.

Progress is new output, or a rank process using more than ``CPU_BUSY`` of a core or reading or
writing anything (a rank importing torch from a slow disk uses little CPU). After
``hang_after`` seconds without progress the job is hung; so is a job silent for that long
whose ranks waiting on their peers (``probes.hang.PEER_WAITS``) are found twice, half a
``hang_after`` apart, at the same place while some rank stays busy (NCCL busy-waits at 100%
CPU; a rank may compute a long evaluation while the others wait for it).
"""

from __future__ import annotations

import subprocess
import time
from typing import TYPE_CHECKING

import psutil

from diagnose.contract import Exit
from diagnose.run.result import RunResult
from diagnose.run.tee import Tee
from probes.hang import RankProcess, find_ranks, spin_signature
from probes.proc import end_tree

if TYPE_CHECKING:
    from diagnose.run.supervise import Interrupts

CPU_BUSY = 0.02  # of one core, per rank: a rank waiting in a collective uses ~0
CPU_WINDOW_S = 1.0
CPU_TICKS_S = 0.02  # two clock ticks: one stray tick is not work
TREE_REFRESH_S = 5.0  # a full process scan costs far more than reading known processes


class RankWatch:
    """Whether a rank used a noticeable share of a core, or read or wrote anything, since the last look.

    Only the ranks count (``probes.hang.find_ranks``): a launcher polls its workers and keeps
    its rendezvous alive, and helpers (a logger's service process, DataLoader workers that
    fill their queue) keep going while the ranks themselves are stuck.
    """

    def __init__(self, root_pid: int, refresh_s: float) -> None:
        self.root_pid = root_pid
        self.refresh_s = refresh_s
        self.procs: dict[int, psutil.Process] = {}
        self.seen: dict[int, tuple[float, float, int]] = {}  # pid -> (when, CPU seconds, characters read + written)
        self.refreshed = 0.0
        self.rank_env: dict[str, str] | None = None
        self.seen_ranks: dict[int, RankProcess] = {}  # every rank process ever found, by pid

    def _refresh(self, now: float) -> None:
        self.refreshed = now
        procs = {}
        for rank in find_ranks(self.root_pid):
            self.seen_ranks[rank.pid] = rank
            try:
                procs[rank.pid] = self.procs.get(rank.pid) or psutil.Process(rank.pid)
                if self.rank_env is None and rank.local_rank is not None:
                    env = procs[rank.pid].environ()
                    self.rank_env = env if "RANK" in env or "LOCAL_RANK" in env else None
            except (psutil.Error, OSError):
                continue
        self.procs = procs

    def busy(self, now: float) -> bool:
        if now - self.refreshed >= self.refresh_s:
            self._refresh(now)
        busy = False
        for pid, proc in list(self.procs.items()):
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    counters = proc.io_counters()
            except psutil.Error:
                self.procs.pop(pid, None)
                continue
            cpu = times.user + times.system
            chars = getattr(counters, "read_chars", counters.read_bytes) + getattr(
                counters, "write_chars", counters.write_bytes
            )
            before = self.seen.get(pid)
            if before is None:  # a rank seen for the first time has just started (or was just found)
                self.seen[pid] = (now, cpu, chars)
                busy = True
                continue
            span = now - before[0]
            if chars != before[2]:
                busy = True
            elif span < CPU_WINDOW_S:
                continue  # CPU time comes in clock ticks: judge it over a long enough window
            elif cpu - before[1] > max(CPU_BUSY * span, CPU_TICKS_S):
                busy = True
            self.seen[pid] = (now, cpu, chars)
        return busy


def watch(
    proc: subprocess.Popen,
    tee: Tee,
    cpu: RankWatch,
    interrupts: Interrupts,
    *,
    hang_after: float,
    keep: bool,
    grace: float,
    collect,
    sample,
) -> RunResult:
    interval = min(1.0, max(0.1, hang_after / 10))
    last_busy = time.monotonic()
    spin_checked, spin_seen = 0.0, None
    while True:
        try:
            code = proc.wait(timeout=interval)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:
            end_tree(proc.pid, grace=0.5)  # leftovers of a job that ended: nothing may outlive it
            if interrupts.status is not None:
                return RunResult("interrupted", interrupts.status, rank_env=cpu.rank_env)
            return RunResult("finished" if code == 0 else "crashed", _exit_status(code), rank_env=cpu.rank_env)
        if interrupts.end.is_set():
            tee.muted = True  # torchrun's traceback about the TERM we send is not the user's error
            end_tree(proc.pid, grace)
            proc.wait()
            return RunResult("interrupted", interrupts.status, rank_env=cpu.rank_env)
        now = time.monotonic()
        if cpu.busy(now):
            last_busy = now
        last_progress = max(tee.last_output, last_busy)
        spinning = False
        silent = now - tee.last_output
        if silent < hang_after / 2:
            spin_seen = None
        elif (
            now - last_progress < hang_after
            and now - spin_checked >= hang_after / 2
            and (spin_seen is None or silent >= hang_after)
        ):
            # silent but busy: stuck only if the ranks waiting on their peers stay put, looked
            # at twice half a --hang-after apart within a silence of a whole one
            spin_checked = now
            seen = spin_signature(sample())
            spinning, spin_seen = seen is not None and seen == spin_seen, seen
        if interrupts.signals or (now - last_progress < hang_after and not spinning):
            continue
        with tee.lock:
            log_bytes = tee.written
        hang = collect()
        result = RunResult(
            "hung",
            int(Exit.FINDINGS),
            idle_s=round(now - last_progress, 1),
            log_bytes=log_bytes,
            hang=hang,
            rank_env=cpu.rank_env,
        )
        if spinning:
            result.notes.append(
                f"no output for {now - tee.last_output:.0f}s; the ranks kept a CPU busy without leaving "
                "their collective (busy-waiting)"
            )
            result.idle_s = round(max(0.0, now - tee.last_output), 1)
        if keep:
            result.kept_pid = proc.pid
        else:
            tee.muted = True
            end_tree(proc.pid, grace)
            proc.wait()
        return result


def _exit_status(code: int) -> int:
    return 128 - code if code < 0 else code
