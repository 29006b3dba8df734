"""``diagnose run -- CMD``: supervise a training job, catch a hang, name its cause.

The command starts in its own session (so its whole tree can be signalled as one group),
its output passes through unchanged (its stdout goes to stderr when stdout must carry a
JSON or markdown document) and a copy is kept in ``OUT/output.log``. Progress is new
output, or a rank process using more than ``CPU_BUSY`` of a core or reading or writing
anything (a rank importing torch from a slow disk uses little CPU). After
``--hang-after`` seconds without progress the job is declared hung; so is a job silent for
that long whose ranks waiting on their peers (``probes.hang.PEER_WAITS``) are found twice,
half a ``--hang-after`` apart, at the same place while some rank stays busy (NCCL busy-waits
at 100% CPU; a rank may compute a long evaluation while the others wait for it). Then every
rank's stack is taken (``probes.hang``), the tree is ended (TERM, then KILL after
``--grace``) unless ``--keep``, and the output up to the moment of the hang goes through the
offline log reader. A job that ends by itself is diagnosed from its log alone. The report
is printed and saved in OUT with the log.

Process hygiene: ``diagnose run`` is a child subreaper (Linux), so a daemon the job
double-forks is re-parented to it and ended with the job; the job's first process, and
through the start-up hook every Python process of the job, gets a parent-death signal, so
killing the supervisor outright (kill -9) still takes the ranks and their ports down. A
first SIGINT is passed to the job (its own Ctrl-C handling runs); a second one, or a
SIGTERM, ends the job: TERM, then KILL after ``--grace``.

Exit status: the job's own when it ended by itself (128+N for a signal N), ``Exit.FINDINGS``
(1) for a hang, 130 / 143 when interrupted by SIGINT / SIGTERM; 2 and 3 as everywhere else.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

import psutil

from diagnose.contract import Exit, Parser, UsageError, kb_option
from probes.facts import Hang
from probes.hang import (
    HOOK_DIR, HOOK_SIGNAL, RankProcess, collect_hang, find_pyspy, find_ranks, first_failure, spin_signature, take_stacks,
)
from probes.proc import become_subreaper, die_with_parent, end, end_tree, signal_group, tree

DEFAULT_HANG_AFTER_S = 300.0
DEFAULT_GRACE_S = 10.0
CPU_BUSY = 0.02  # of one core, per rank: a rank waiting in a collective uses ~0
CPU_WINDOW_S = 1.0
CPU_TICKS_S = 0.02  # two clock ticks: one stray tick is not work
TREE_REFRESH_S = 5.0  # a full process scan costs far more than reading known processes
FR_BUFFER_ENTRIES = "2000"
ADOPTED_GRACE_S = 1.0  # a daemon the job left behind gets this long to exit on TERM
LIVE_JOIN_S = 30.0
LAST_LINE_BYTES = 4096
LIVE_SECTIONS = ("host", "packages", "torch", "gpus", "driver", "env", "launcher")


def build_run_parser() -> Parser:
    parser = Parser(
        prog="diagnose run",
        usage="%(prog)s [options] -- CMD ARGS...",
        description="Run a training command under supervision: pass its output through, detect a hang, "
        "take every rank's stack, end the job and diagnose it.",
        epilog="Exit status: the job's own when it ends by itself, 1 on a hang, 2 bad usage, 3 internal failure.",
    )
    parser.add_argument("--hang-after", type=float, default=DEFAULT_HANG_AFTER_S, metavar="S", help=f"seconds without progress before the job counts as hung (default {DEFAULT_HANG_AFTER_S:g})")
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE_S, metavar="S", help=f"seconds between TERM and KILL when ending a hung job (default {DEFAULT_GRACE_S:g})")
    parser.add_argument("--keep", action="store_true", help="leave a hung job running after taking its stacks (its output is no longer copied once diagnose exits)")
    parser.add_argument("--out", metavar="DIR", help="where the log, report and dumps go (default ./diagnose-run-TIMESTAMP)")
    parser.add_argument("--no-debug-env", action="store_true", help="do not turn on the Flight Recorder and TORCH_NCCL_DESYNC_DEBUG")
    parser.add_argument("--json", action="store_true", help="print the JSON report (same as --format json)")
    parser.add_argument("--format", choices=["text", "json", "markdown"], help="output format (default: the interactive view at a terminal, else text)")
    kb_option(parser)
    return parser


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" not in argv:
        build_run_parser().parse_known_args(argv)  # --help, and option errors, come first
        raise UsageError("give the command after `--`: diagnose run [options] -- CMD ARGS...")
    cut = argv.index("--")
    if cut == len(argv) - 1:
        raise UsageError("no command after `--`")
    return argv[:cut], argv[cut + 1 :]


# --- the job's environment -------------------------------------------------------------------


def job_env(base: Mapping[str, str], out: Path, debug_env: bool, die_with_us: bool = True) -> tuple[dict[str, str], Path | None]:
    """The job's environment and the Flight Recorder dump folder (None when it is off).

    Variables the user set are kept as they are: only unset ones get diagnose's values.
    ``die_with_us``: the job's Python processes ask to be killed with their parent (not for
    ``--keep``, whose job must outlive the supervisor).
    """
    env = dict(base)
    hook_dir = out / ".hook"
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR), *filter(None, [base.get("PYTHONPATH")])])
    env["DIAGNOSE_HOOK_DIR"] = str(hook_dir)
    env["DIAGNOSE_HOOK_SIGNAL"] = str(HOOK_SIGNAL)
    if die_with_us:
        env["DIAGNOSE_DIE_WITH"] = "leader"  # the hook's parent-death chain starts at the job's first process
    if not debug_env:
        return env, None
    fr_dir = out / "flight-recorder"
    size = env.get("TORCH_FR_BUFFER_SIZE") or env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or FR_BUFFER_ENTRIES
    env.setdefault("TORCH_FR_BUFFER_SIZE", size)
    env.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(fr_dir / "nccl_trace_rank_"))
    if _older_torch():  # newer torch warns about the old names
        env.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", size)
        env.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(fr_dir / "nccl_trace_rank_"))
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    env.setdefault("TORCH_NCCL_DESYNC_DEBUG", "1")
    if env["TORCH_FR_BUFFER_SIZE"].strip() in ("", "0"):
        return env, None
    env["DIAGNOSE_FR_DIR"] = str(fr_dir)
    return env, fr_dir


def _older_torch() -> bool:
    """Whether the job's torch may predate the TORCH_FR_* names (2.7); unknown counts as yes."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import InvalidVersion, Version

    try:
        return Version(version("torch")).release < (2, 7)
    except (PackageNotFoundError, InvalidVersion):
        return True


# --- supervision ---------------------------------------------------------------------------------


@dataclass
class RunResult:
    outcome: str  # finished, crashed, hung, interrupted
    exit_code: int | None
    idle_s: float | None = None
    log_path: Path | None = None
    log_bytes: int = 0  # how much of the log to diagnose: up to the hang, not its teardown
    hang: Hang | None = None  # when hung
    rank_env: dict[str, str] | None = None  # the environment of one rank, for launcher facts
    notes: list[str] = field(default_factory=list)
    kept_pid: int | None = None  # a hung job left running by --keep
    live: object = None  # what ``supervise(live=...)`` gathered while the job ran (Facts, or the exception)


class _Tee:
    """Copies a child's stream to one of ours unchanged and into the shared log."""

    def __init__(self, log: IO[bytes]) -> None:
        self.log = log
        self.lock = threading.Lock()
        self.written = 0
        self.last_output = time.monotonic()
        self.threads: list[threading.Thread] = []
        self.muted = False  # once the supervisor ends the job: its reaction goes to the log only

    def start(self, stream: IO[bytes], sink: IO[bytes]) -> None:
        thread = threading.Thread(target=self._pump, args=(stream, sink), daemon=True)
        thread.start()
        self.threads.append(thread)

    def _pump(self, stream: IO[bytes], sink: IO[bytes]) -> None:
        fd = stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            self.last_output = time.monotonic()
            with self.lock:
                self.log.write(chunk)
                self.log.flush()
                self.written += len(chunk)
            if self.muted:
                continue
            try:
                sink.write(chunk)
                sink.flush()
            except (OSError, ValueError):
                pass  # our own output went away; keep the copy anyway
        stream.close()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))


class _RankWatch:
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
            chars = getattr(counters, "read_chars", counters.read_bytes) + getattr(counters, "write_chars", counters.write_bytes)
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


class _Interrupts:
    """SIGINT and SIGTERM while the job runs. A first SIGINT goes to the job, whose own
    Ctrl-C handling may save a checkpoint; a second one, or any SIGTERM, ends it (TERM,
    KILL after the grace): a job that ignores both still goes."""

    def __init__(self, proc: subprocess.Popen, grace: float, stderr: IO[bytes]) -> None:
        self.proc, self.grace, self.stderr = proc, grace, stderr
        self.signals: list[int] = []
        self.end = threading.Event()
        self.previous: dict[int, object] = {}

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    @property
    def status(self) -> int | None:
        """128 + the signal that ended the run: SIGTERM wins over SIGINT."""
        if not self.signals:
            return None
        return 128 + (signal.SIGTERM if signal.SIGTERM in self.signals else signal.SIGINT)

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
        tee = _Tee(log)
        tee.start(proc.stdout, stdout)
        tee.start(proc.stderr, stderr)
        py_spy = py_spy or find_pyspy()
        cpu = _RankWatch(proc.pid, refresh_s=min(TREE_REFRESH_S, hang_after / 3))
        gathered = _LiveFacts(live) if live is not None else None
        try:
            with _Interrupts(proc, grace, stderr) as interrupts:
                result = _watch(
                    proc, tee, cpu, interrupts, hang_after=hang_after, keep=keep, grace=grace,
                    collect=lambda: collect_hang(proc.pid, hook_dir=hook_dir, fr_dir=fr_dir, py_spy=py_spy, methods=methods,
                                                 known=list(cpu.seen_ranks.values())),
                    sample=lambda: take_stacks(find_ranks(proc.pid), hook_dir=hook_dir, py_spy=py_spy, methods=methods)[0],
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


def _watch(proc: subprocess.Popen, tee: _Tee, cpu: _RankWatch, interrupts: _Interrupts, *, hang_after: float,
           keep: bool, grace: float, collect, sample) -> RunResult:
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
        elif now - last_progress < hang_after and now - spin_checked >= hang_after / 2 and (spin_seen is None or silent >= hang_after):
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
        result = RunResult("hung", int(Exit.FINDINGS), idle_s=round(now - last_progress, 1),
                           log_bytes=log_bytes, hang=hang, rank_env=cpu.rank_env)
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


# --- facts and report ------------------------------------------------------------------------------


def run_facts(command: Sequence[str], result: RunResult):
    from probes import env as env_probe
    from probes import launcher as launcher_probe
    from probes.facts import Facts, ProbeError
    from probes.log import LogError, log_from_text, read_log

    facts = Facts(
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        inputs=[f"run:{shlex.join(command)[:200]}", f"log:{result.log_path}"],
    )
    if result.log_path is not None:
        with open(result.log_path, "rb") as f:
            try:
                facts.log = read_log(_Prefix(f, result.log_bytes), str(result.log_path))
            except LogError as exc:  # a job that printed binary data: the stacks still stand
                facts.errors.append(ProbeError(probe="log", message=str(exc)))
    if isinstance(result.live, Facts):
        facts.inputs.append("live")
        for section in LIVE_SECTIONS:
            setattr(facts, section, getattr(result.live, section))
        facts.errors.extend(result.live.errors)
    elif isinstance(result.live, Exception):
        facts.errors.append(ProbeError(probe="live", message=f"{type(result.live).__name__}: {result.live}"))
    if result.rank_env is not None:
        facts.launcher = launcher_probe.probe(result.rank_env)
        facts.env = env_probe.probe(result.rank_env)
    hang = result.hang if result.hang is not None else Hang(source="hang", detected=False)
    if result.log_path is not None:
        hang.last_output = _last_line(result.log_path, result.log_bytes)
    if result.outcome == "crashed" and result.log_path is not None:
        facts.hang = hang
        with open(result.log_path, encoding="utf-8", errors="replace") as f:
            hang.first_failure = first_failure(f, first_failing_rank(facts), log_from_text)
    hang.outcome = result.outcome
    hang.exit_code = result.exit_code if result.outcome != "hung" else None
    hang.idle_s = result.idle_s
    facts.hang = hang
    return facts


def _last_line(path: Path, limit: int) -> str | None:
    """The last non-empty line among the first ``limit`` bytes of the log."""
    with open(path, "rb") as f:
        f.seek(max(0, limit - LAST_LINE_BYTES))
        tail = f.read(min(limit, LAST_LINE_BYTES)).decode("utf-8", errors="replace")
    lines = [line.strip() for line in tail.replace("\r", "\n").splitlines() if line.strip()]
    return lines[-1][:300] if lines else None


class _Prefix:
    """The first ``limit`` bytes of a file, read in blocks: a multi-GB log stays out of memory."""

    def __init__(self, f: IO[bytes], limit: int) -> None:
        self.f, self.left = f, limit

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(self.left if size < 0 else min(size, self.left))
        self.left -= len(data)
        return data


def summary_lines(result: RunResult, facts, out: Path) -> list[str]:
    """What happened, for stderr: stdout carries only the report."""
    lines = []
    if result.outcome == "hung":
        ranks = facts.hang.ranks or []
        methods = sorted({r.method for r in ranks if r.method})
        lines.append(
            f"no progress for {result.idle_s:g}s: the job is hung; stacks of {sum(r.method is not None for r in ranks)}"
            f" of {len(ranks)} rank(s) taken with {', '.join(methods) or 'nothing'}"
        )
        for rank in ranks:
            lines.append(f"  rank {_rank_name(rank)}: {_where(rank)}")
        if facts.hang.sequence not in (None, "in-step"):
            lines.append(f"  flight recorder, read as a sequence: {SEQUENCE_WORDS[facts.hang.sequence]}")
        for call in facts.hang.rank_zero_calls or []:
            lines.append(f"  source: {call.call} at {call.file}:{call.line} runs only under `{call.condition}`")
        for straggler in facts.hang.stragglers or []:
            if straggler.ops:
                calls = ", ".join(f"{op} on rank {rank}" for rank, op in straggler.ops.items())
                lines.append(f"  flight recorder: collective #{straggler.seq} differs across ranks: {calls}")
            else:
                lines.append(
                    f"  flight recorder: {straggler.op or 'collective'} #{straggler.seq} entered by rank(s) "
                    f"{_ranks(straggler.entered)}, never by {_ranks(straggler.missing)}"
                )
        lines.extend(f"  {note}" for note in result.notes)
        if result.kept_pid is not None:
            lines.append(f"  left running (--keep): the job's process group is {result.kept_pid}")
        if facts.hang.unavailable:
            lines.extend(f"  {why}" for why in facts.hang.unavailable.values())
    elif result.outcome == "finished":
        lines.append(f"the job finished (exit {result.exit_code})")
    else:
        what = "was interrupted" if result.outcome == "interrupted" else "failed"
        first = first_failing_rank(facts)
        lines.append(f"the job {what} (exit {result.exit_code})" + (f"; first failing rank: {first}" if first is not None else ""))
        failure = facts.hang.first_failure
        if failure is not None and failure.exception:
            at = f" at {failure.user_frame.file}:{failure.user_frame.line}" if failure.user_frame else ""
            lines.append(f"  its exception: {failure.exception}: {(failure.message or '')[:160]}{at}")
    lines.append(f"log, report and dumps saved in {out}")
    return lines


SEQUENCE_WORDS = {
    "uneven-iterations": "every rank repeated the same collectives until some ranks ran one more step (uneven batches)",
    "size-mismatch": "the ranks called one collective with tensors of different shapes",
    "different-ops": "the ranks called different collectives at the same point (divergent code)",
    "rank-behind": "some ranks have not issued the collective the others wait in",
}


def _where(rank) -> str:
    """One rank's place: what it does, the user's line, and the library call it is in."""
    at = f" at {rank.user_frame.file}:{rank.user_frame.line}" if rank.user_frame else ""
    via = f" (in {rank.library_frame.function})" if rank.library_frame and rank.library_frame.function else ""
    if rank.activity == "exited":
        return "exited while the others still ran"
    if rank.activity in ("compute", "io", "data") and rank.waiting_in in ("user_code", "other"):
        return f"busy in its own work{at}"
    return f"waits in {rank.waiting_in or 'unknown'}{at}{via}"


def first_failing_rank(facts) -> int | None:
    signatures = facts.log.signatures or []
    for sig in signatures:
        if sig.id == "child_failed" and sig.data.get("first_failing_rank", "").isdigit():
            return int(sig.data["first_failing_rank"])
    ranked = sorted((s.line, s.rank) for s in signatures if s.rank is not None and s.id == "python_exception")
    return ranked[0][1] if ranked else None


def _rank_name(rank) -> str:
    if rank.rank is not None:
        return str(rank.rank)
    return f"? (local {rank.local_rank}, pid {rank.pid})" if rank.local_rank is not None else f"? (pid {rank.pid})"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) or "none"


# --- the command ---------------------------------------------------------------------------------------


def _seconds(option: str, value: float, *, zero: bool) -> None:
    """A number of seconds must be finite and positive (or zero where that means "at once"):
    nan compares false with everything, so an unchecked one silently turns every test off."""
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise UsageError(f"{option} must be a finite number of seconds, {'0 or more' if zero else 'more than 0'} (got {value:g})")


def live_facts():
    """This machine's torch, GPUs and packages (env and launcher come from a rank's own
    environment once the job is over)."""
    from probes.collect import collect

    return collect()


def cmd_run(argv: Sequence[str]) -> int:
    options, command = split_command(argv)
    args = build_run_parser().parse_args(options)
    if args.json and args.format not in (None, "json"):
        raise UsageError("--json and --format disagree")
    requested = "json" if args.json else args.format
    fmt = requested or "text"
    _seconds("--hang-after", args.hang_after, zero=False)
    _seconds("--grace", args.grace, zero=True)
    from diagnose.engine import evaluate
    from diagnose.kb import load_kb
    from diagnose.render import render
    from probes.snapshot import dump_snapshot

    kb = load_kb(args.kb)  # a broken rule stops us before the job starts, not after it hangs
    out = Path(args.out or f"diagnose-run-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{out}: cannot create: {exc.strerror or exc}") from None
    env, fr_dir = job_env(os.environ, out.resolve(), debug_env=not args.no_debug_env, die_with_us=not args.keep)
    # a document on stdout must stay parseable: then the job's stdout joins its stderr
    job_stdout = sys.stdout.buffer if fmt == "text" else sys.stderr.buffer
    become_subreaper()
    result = supervise(command, out=out, hang_after=args.hang_after, keep=args.keep, grace=args.grace,
                       env=env, fr_dir=fr_dir, stdout=job_stdout, live=live_facts)
    facts = run_facts(command, result)
    report = evaluate(facts, kb)
    (out / "facts.json").write_text(dump_snapshot(facts) + "\n", encoding="utf-8")
    (out / "report.json").write_text(render(report, "json"), encoding="utf-8")
    for line in summary_lines(result, facts, out):
        print(f"diagnose run: {line}", file=sys.stderr, flush=True)
    if requested is None and sys.stdout.isatty() and sys.stdin.isatty():
        from diagnose.tui import make_app

        make_app(report=report).run()
    else:
        color = fmt == "text" and sys.stdout.isatty() and "NO_COLOR" not in os.environ
        sys.stdout.write(render(report, fmt, color=color))
        sys.stdout.flush()
    return result.exit_code if result.exit_code is not None else int(Exit.FINDINGS)
