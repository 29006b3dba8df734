"""Start the job in its own session, watch it to its end or its hang, leave nothing behind.

Process hygiene: the job's first process gets a parent-death signal (``probes.proc``), the
start-up hook asks the same for every Python process of the job, and ``diagnose run`` is a
child subreaper, so a daemon the job double-forks is ended with the job. A first SIGINT is
passed to the job (its own Ctrl-C handling runs); a second one, or a SIGTERM, ends it: TERM,
then KILL after the grace.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

import psutil

from diagnose.contract import Exit, UsageError
from diagnose.run.result import RunResult
from diagnose.run.tee import Tee
from diagnose.run.watch import TREE_REFRESH_S, RankWatch, watch
from probes.hang import collect_hang, find_pyspy, find_ranks, take_stacks
from probes.proc import die_with_parent, end, end_tree, signal_group, tree

DEFAULT_GRACE_S = 10.0
ADOPTED_GRACE_S = 1.0  # a daemon the job left behind gets this long to exit on TERM
LIVE_JOIN_S = 30.0


def _children() -> set[int]:
    try:
        return {c.pid for c in psutil.Process().children()}
    except psutil.Error:
        return set()


def end_adopted(known: set[int], grace: float) -> None:
    """End the processes re-parented to us (as a subreaper) since ``known`` was taken, and
    everything under them: what the job left behind."""
    for pid in sorted(_children() - known):
        end(tree(pid), grace=grace)


class Interrupts:
    """SIGINT and SIGTERM while the job runs. A first SIGINT goes to the job, whose own
    Ctrl-C handling may save a checkpoint; a second one, or any SIGTERM, ends it (TERM,
    KILL after the grace): a job that ignores both still goes."""

    def __init__(self, proc: subprocess.Popen, grace: float, stderr: IO[bytes]) -> None:
        self.proc, self.grace, self.stderr = proc, grace, stderr
        self.signals: list[int] = []
        self.end = threading.Event()
        self.previous: dict[int, object] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    @property
    def status(self) -> int | None:
        """The exit status of a run the user ended, 128 + the signal: SIGTERM wins over SIGINT."""
        if not self.signals:
            return None
        return int(Exit.TERMINATED if signal.SIGTERM in self.signals else Exit.INTERRUPTED)

    def _handle(self, signum: int, _frame) -> None:
        self.signals.append(signum)
        if signum == signal.SIGINT and len(self.signals) == 1:
            self._say(f"interrupted: passed to the job; interrupt again to end it (TERM, KILL after {self.grace:g}s)")
            signal_group(self.proc.pid, signal.SIGINT)
            return
        if not self.end.is_set():
            self._say(f"ending the job (TERM, KILL after {self.grace:g}s)")
            self.end.set()

    def _say(self, text: str) -> None:
        try:
            self.stderr.write(f"diagnose run: {text}\n".encode())
            self.stderr.flush()
        except (OSError, ValueError):
            pass


def supervise(
    command: Sequence[str],
    *,
    out: Path,
    hang_after: float,
    keep: bool = False,
    grace: float = DEFAULT_GRACE_S,
    env: Mapping[str, str] | None = None,
    fr_dir: Path | None = None,
    methods: Sequence[str] = ("py-spy", "faulthandler"),
    py_spy: str | None = None,
    stdout: IO[bytes] | None = None,
    stderr: IO[bytes] | None = None,
    live: Callable[[], object] | None = None,
) -> RunResult:
    """Run ``command`` to its end or its hang; everything it printed is in ``out/output.log``.

    ``live``, when given, is called on a thread while the job runs and its return value
    lands in ``RunResult.live``.
    """
    out.mkdir(parents=True, exist_ok=True)
    hook_dir = out / ".hook"
    hook_dir.mkdir(exist_ok=True)
    if fr_dir is not None:
        fr_dir.mkdir(exist_ok=True)
    log_path = out / "output.log"
    stdout = stdout or sys.stdout.buffer
    stderr = stderr or sys.stderr.buffer
    known = _children()
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(
                list(command),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env) if env is not None else None,
                start_new_session=True,
                preexec_fn=None if keep else die_with_parent,
            )
        except OSError as exc:
            raise UsageError(f"{command[0]}: cannot start: {exc.strerror or exc}") from None
        tee = Tee(log)
        tee.start(proc.stdout, stdout)
        tee.start(proc.stderr, stderr)
        py_spy = py_spy or find_pyspy()
        cpu = RankWatch(proc.pid, refresh_s=min(TREE_REFRESH_S, hang_after / 3))
        gathered = _LiveFacts(live) if live is not None else None
        try:
            with Interrupts(proc, grace, stderr) as interrupts:
                result = watch(
                    proc,
                    tee,
                    cpu,
                    interrupts,
                    hang_after=hang_after,
                    keep=keep,
                    grace=grace,
                    collect=lambda: collect_hang(
                        proc.pid,
                        hook_dir=hook_dir,
                        fr_dir=fr_dir,
                        py_spy=py_spy,
                        methods=methods,
                        known=list(cpu.seen_ranks.values()),
                    ),
                    sample=lambda: take_stacks(find_ranks(proc.pid), hook_dir=hook_dir, py_spy=py_spy, methods=methods)[
                        0
                    ],
                )
                if gathered is not None:
                    result.live = gathered.result()
                if result.outcome != "hung" or not keep:
                    end_adopted(known, min(grace, ADOPTED_GRACE_S))
                    tee.join(timeout=5.0)
                    # the hook's FIFOs and stack files served the live job only; what they gave is in the facts
                    shutil.rmtree(hook_dir, ignore_errors=True)
                    if fr_dir is not None and fr_dir.is_dir() and not any(fr_dir.iterdir()):
                        fr_dir.rmdir()
        except BaseException:
            end_tree(proc.pid, grace)  # the supervisor failing must not leave the job running unwatched
            end_adopted(known, 0.0)
            shutil.rmtree(hook_dir, ignore_errors=True)
            raise
        result.log_path = log_path
        if result.outcome != "hung":
            with tee.lock:
                result.log_bytes = tee.written
    return result


class _LiveFacts:
    """This machine's facts, gathered on a thread while the job runs: the torch, GPUs and
    packages the job sees, not whatever is left once it has gone."""

    def __init__(self, live: Callable[[], object]) -> None:
        self.value: object = None
        self.thread = threading.Thread(target=self._run, args=(live,), name="diagnose-live", daemon=True)
        self.thread.start()

    def _run(self, live: Callable[[], object]) -> None:
        try:
            self.value = live()
        except Exception as exc:  # noqa: BLE001 - facts are a bonus; the run's diagnosis stands without them
            self.value = exc

    def result(self) -> object:
        self.thread.join(LIVE_JOIN_S)
        return self.value
