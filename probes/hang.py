"""The stacks of a hung job -> ``Facts.hang``.

``collect_hang(root_pid, ...)`` finds the ranks among the job's processes (``RANK`` and
``LOCAL_RANK`` from each one's environment), takes each rank's Python stack, and says where
it waits. Two ways to take a stack, tried in order:

* ``py-spy``: ``py-spy dump --pid P --json``, which reads the process's memory over ptrace;
* ``faulthandler``: where ptrace is refused (containers without CAP_SYS_PTRACE, a Yama
  scope) or py-spy is missing, the job was started with ``probes/_hook`` on PYTHONPATH, whose
  ``sitecustomize`` registered ``faulthandler`` on ``HOOK_SIGNAL`` into a per-process file;
  the supervisor sends the signal and parses what it wrote.

Each ``RankStack`` records the method used, the main thread's frames (innermost first, at
most ``MAX_FRAMES``), the innermost frame of the user's own code (``user_frame``: not the
standard library, not an installed package), and ``waiting_in``, the first recognised call
walking outwards from the innermost frame. Its vocabulary (rules match it with ``{hang:
REGEX}``):

  barrier               dist.barrier / monitored_barrier (also Lightning, Fabric, accelerate)
  all_reduce, all_gather, reduce_scatter, broadcast, reduce, gather, scatter, all_to_all,
  send, recv            the torch.distributed collective of that name (DDP's initial
                        parameter sync is ``broadcast``)
  verify_params         DDP's _verify_param_shape_across_processes at construction
  init_process_group    init_process_group / new_group, past the store
  rendezvous            the TCP store / rendezvous handlers, the store-based barrier
  dataloader            waiting for a batch from the DataLoader (its workers)
  load                  torch.load, load_state_dict, from_pretrained, safetensors,
                        Lightning's checkpoint loading
  save                  torch.save
  deepspeed_initialize  deepspeed.initialize
  compile               torch.compile (dynamo / inductor)
  import                importing a module (a slow or locked file system, a module's own work)
  cuda_sync             torch.cuda.synchronize, a stream or event synchronize
  user_code             none of the above; the innermost frame is the user's own code
                        (computing, sleeping, or in a C call the stack does not show)
  other                 none of the above, inside library code

Flight Recorder dumps are read too (``read_flight_recorder``): torch's own dumps on timeout
(pickles, read without allowing any class) and the JSON dumps the hook writes on request.
Per rank they give the last collectives with sequence ids and states; across ranks, the
first collective of each process group that some ranks entered and others never reached
(``Hang.stragglers``).
"""

from __future__ import annotations

import ast
import functools
import io
import json
import os
import pickle
import re
import signal
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil

from probes.facts import RANK_PREFIX, Collective, Failure, Frame, Hang, RankStack, SourceCall, Straggler
from probes.runner import Result
from probes.runner import run as run_command

MAX_FRAMES = 40
LAST_COLLECTIVES = 5
FR_WAIT_S = 5.0  # for every rank's Flight Recorder dump; a loaded machine can take seconds (it stops once all are in)
MAX_STEP_OPS = 16  # the most collectives one training step issues that the sequence reader looks for
PYSPY_TIMEOUT_S = 10.0
FAULTHANDLER_WAIT_S = 3.0
HOOK_DIR = Path(__file__).parent / "_hook"
# A real-time signal: nothing in Python, torch or Lightning uses one (Lightning's SLURM
# requeue takes SIGUSR1). Only processes whose hook registered it are ever sent it.
HOOK_SIGNAL = int(getattr(signal, "SIGRTMIN", signal.SIGUSR2)) + (4 if hasattr(signal, "SIGRTMIN") else 0)

_C10D = r"torch/distributed/distributed_c10d\.py$"
_LIGHTNING = r"(lightning|pytorch_lightning|lightning_fabric)/"
# (waiting_in, file pattern, function pattern): the first row matching a frame names it
_WAITS: list[tuple[str, str, str]] = [
    ("verify_params", r"torch/distributed/", r"_verify_params?(_shape)?_across_processes"),
    ("rendezvous", r"torch/distributed/(rendezvous\.py|elastic/rendezvous/)", r"(?!<module>).*"),
    ("rendezvous", _C10D, r"_store_based_barrier"),
    ("init_process_group", _C10D, r"init_process_group|new_group|_new_group_with_tag|_new_process_group_helper"),
    ("barrier", _C10D, r"barrier|monitored_barrier"),
    ("all_reduce", _C10D, r"all_reduce\w*"),
    ("all_gather", _C10D, r"_?all_gather\w*"),
    ("reduce_scatter", _C10D, r"_?reduce_scatter\w*"),
    ("broadcast", _C10D, r"broadcast\w*"),
    ("all_to_all", _C10D, r"all_to_all\w*"),
    ("reduce", _C10D, r"reduce"),
    ("gather", _C10D, r"gather|gather_object"),
    ("scatter", _C10D, r"scatter|scatter_object_list"),
    ("send", _C10D, r"i?send|send_object_list"),
    ("recv", _C10D, r"i?recv|recv_object_list"),
    ("broadcast", r"torch/distributed/utils\.py$", r"_sync_params_and_buffers|_sync_module_states"),
    ("barrier", _LIGHTNING + r"|accelerate/", r"barrier|wait_for_everyone"),
    ("dataloader", r"torch/utils/data/", r"_next_data|_get_data|_try_get_data|__next__"),
    ("cuda_sync", r"torch/cuda/", r"synchronize"),
    ("load", r"torch/serialization\.py$", r"_?load\w*"),
    ("save", r"torch/serialization\.py$", r"_?save\w*"),
    ("load", r"torch/nn/modules/module\.py$", r"load_state_dict"),
    ("load", r"(transformers|diffusers|peft)/", r"from_pretrained|_?load_\w*"),
    ("load", r"safetensors/", r"load\w*|safe_open"),
    ("load", _LIGHTNING, r"_?load_(from_)?checkpoint\w*|load_from_checkpoint"),
    ("deepspeed_initialize", r"deepspeed/__init__\.py$", r"initialize"),
    ("compile", r"torch/(_dynamo|_inductor)/", r"(?!<module>).*"),  # <module>: being imported
    ("import", r"^<frozen importlib", r".*"),
]
_WAIT_PATTERNS = [(name, re.compile(f), re.compile(fn)) for name, f, fn in _WAITS]
_STDLIB = re.compile(r"/lib(64)?/python3\.\d+/(?!site-packages/|dist-packages/)")


class StackError(Exception):
    """A stack could not be taken; ``refused`` when the kernel refused ptrace."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


# --- where a stack waits ------------------------------------------------------------------


# the libraries whose own code a traceback runs through, by the folder their modules live in
_LIBRARIES = {
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "lightning_fabric": "lightning",
    "deepspeed": "deepspeed",
    "accelerate": "accelerate",
    "transformers": "transformers",
    "peft": "peft",
    "bitsandbytes": "bitsandbytes",
}


# packages whose files py-spy names by their path below the import path
_PACKAGES = frozenset(
    {*_LIBRARIES, "torch", "torchmetrics", "torchvision", "torchaudio", "numpy", "diffusers", "safetensors"}
)


def is_library(path: str) -> bool:
    path = path.replace("\\", "/")
    return (
        path.startswith("<")
        or "/site-packages/" in path
        or "/dist-packages/" in path
        or _STDLIB.search(path) is not None
        # a path elided in a pasted traceback (".../deepspeed/runtime/engine.py")
        or (path.startswith("...") and any(f in _LIBRARIES or f == "torch" for f in path.split("/")[:-1]))
        # py-spy's, relative to the import path ("torch/distributed/distributed_c10d.py")
        or ("/" in path and path.split("/", 1)[0] in _PACKAGES)
    )


def classify(frames: Sequence[Frame]) -> str | None:
    """Where a stack (innermost frame first) waits; None for an empty stack."""
    return _classified(frames)[0]


def _classified(frames: Sequence[Frame]) -> tuple[str | None, Frame | None]:
    """(waiting_in, the library frame that names it)."""
    if not frames:
        return None, None
    for frame in frames:
        path = frame.file.replace("\\", "/")
        function = (frame.function or "").rsplit(".", 1)[-1]
        for name, file_re, function_re in _WAIT_PATTERNS:
            if file_re.search(path) and function_re.fullmatch(function):
                return name, frame
    return ("other" if is_library(frames[0].file) else "user_code"), None


_ACTIVITY = {"dataloader": "data", "load": "io", "save": "io", "import": "io"}


def activity(waiting_in: str | None) -> str | None:
    """What a rank is doing, in the coarse terms of ``RankStack.activity``."""
    if waiting_in is None:
        return None
    return "collective" if waiting_in in PEER_WAITS else _ACTIVITY.get(waiting_in, "compute")


def frame_library(frames: Sequence[Frame]) -> str | None:
    """Of frames innermost first, the library (of _LIBRARIES) that the innermost frame inside one
    belongs to: which library called into torch when torch failed. Paths may be shortened
    (".../deepspeed/runtime/x.py")."""
    for frame in frames:
        folders = frame.file.replace("\\", "/").split("/")[:-1]
        found = next((_LIBRARIES[f] for f in reversed(folders) if f in _LIBRARIES), None)
        if found:
            return found
    return None


def user_frame(frames: Sequence[Frame]) -> Frame | None:
    return next((f for f in frames if not is_library(f.file)), None)


def rank_stack(frames: list[Frame], **fields) -> RankStack:
    waiting_in, library = _classified(frames)
    return RankStack(
        frames=frames[:MAX_FRAMES],
        waiting_in=waiting_in,
        user_frame=user_frame(frames),
        library_frame=library,
        activity=activity(waiting_in),
        rank_branch=rank_branch(frames),
        **fields,
    )


# --- py-spy ---------------------------------------------------------------------------------

_REFUSED = re.compile(r"(?i)permission denied|operation not permitted|ptrace|EPERM|CAP_SYS_PTRACE")


def parse_pyspy(text: str, pid: int) -> tuple[list[Frame], str | None]:
    """The main thread of ``py-spy dump --json``: (frames innermost first, active|idle)."""
    try:
        threads = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StackError(f"py-spy printed no JSON ({exc.msg})") from None
    if not isinstance(threads, list) or not threads:
        raise StackError("py-spy found no Python thread")
    main = next((t for t in threads if t.get("thread_name") == "MainThread"), None)
    main = main or next((t for t in threads if t.get("os_thread_id") == pid), threads[0])
    frames = [
        Frame(file=f.get("filename") or "?", line=f.get("line"), function=f.get("name"))
        for f in main.get("frames") or []
    ]
    active = main.get("active")
    return frames, None if active is None else ("active" if active else "idle")


# py-spy dump's text, as users paste it: 'Thread 0x7F3A (idle): "MainThread"', then one
# indented 'function (file:line)' per frame, innermost first (--locals indents its values deeper)
_PYSPY_THREAD = re.compile(r'^\s*Thread (?:0x[0-9a-fA-F]+|\d+) \((?P<state>idle|active)[^)]*\): "(?P<name>[^"]*)"')
_PYSPY_FRAME = re.compile(r"^\s+(?P<function>[\w.<>]+) \((?P<file>[^():]+):(?P<line>\d+)\)\s*$")


def pasted_stacks(lines: Iterable[str]) -> list[RankStack]:
    """The main threads of the py-spy dumps a log holds (``py-spy dump`` printed, not its
    JSON), one stack each: a report that shows where its hung ranks wait."""
    stacks: list[RankStack] = []
    frames: list[Frame] | None = None  # the main thread's, while its frames are read
    state = None
    for raw in [*lines, ""]:
        line = RANK_PREFIX.sub("", raw.rstrip("\n"))
        thread = _PYSPY_THREAD.match(line)
        frame = None if thread or frames is None else _PYSPY_FRAME.match(line)
        if frame:
            frames.append(Frame(file=frame["file"], line=int(frame["line"]), function=frame["function"]))
            continue
        if frames is not None and (thread or not line.startswith(" " * 8)):
            if frames:
                stacks.append(rank_stack(frames, method="py-spy", state=state))
            frames = None
        if thread and thread["name"] == "MainThread":
            frames, state = [], thread["state"]
    return stacks[:MAX_TRACEBACKS]


def pyspy_stack(pid: int, py_spy: str, run: Callable[..., Result] = run_command) -> tuple[list[Frame], str | None]:
    result = run([py_spy, "dump", "--pid", str(pid), "--json"], timeout=PYSPY_TIMEOUT_S)
    if result.error:
        raise StackError(f"py-spy: {result.error}")
    if result.timed_out:
        raise StackError(f"py-spy: no answer in {PYSPY_TIMEOUT_S:g}s")
    if result.returncode != 0:
        message = (result.stderr.strip() or result.stdout.strip() or f"exit {result.returncode}").splitlines()[-1]
        raise StackError(f"py-spy: {message[:200]}", refused=bool(_REFUSED.search(result.stderr + result.stdout)))
    return parse_pyspy(result.stdout, pid)


def find_pyspy() -> str | None:
    import shutil
    import sys

    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


# --- faulthandler -------------------------------------------------------------------------------

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.+?)\s*$')


def parse_faulthandler(text: str, main_thread: int | None) -> list[Frame]:
    """The main thread's frames from a faulthandler dump (innermost first, as it writes)."""
    threads: dict[int, list[Frame]] = {}
    current: list[Frame] | None = None
    order: list[int] = []
    for line in text.splitlines():
        header = _THREAD.match(line)
        if header:
            ident = int(header.group(1), 16)
            current = threads.setdefault(ident, [])
            current.clear()  # a later dump of the same thread replaces an earlier one
            order.append(ident)
            continue
        frame = _FH_FRAME.match(line)
        if frame and current is not None:
            number = frame.group(2)
            current.append(
                Frame(file=frame.group(1), line=int(number) if number.isdigit() else None, function=frame.group(3))
            )
    if main_thread in threads:
        return threads[main_thread]
    return threads[order[0]] if order else []


def faulthandler_stack(pid: int, hook_dir: Path) -> list[Frame]:
    marker_path = hook_dir / f"{pid}.json"
    stack_path = hook_dir / f"{pid}.stack"
    try:
        marker = json.loads(marker_path.read_text())
    except (OSError, ValueError):
        raise StackError("faulthandler: the process did not load the diagnose hook") from None
    start = stack_path.stat().st_size if stack_path.exists() else 0
    try:
        os.kill(pid, HOOK_SIGNAL)
    except OSError as exc:
        raise StackError(f"faulthandler: cannot signal pid {pid}: {exc.strerror}") from None
    deadline = time.monotonic() + FAULTHANDLER_WAIT_S
    size = start
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = stack_path.stat().st_size
        if now > start and now == size:  # written and no longer growing
            break
        size = now
    with open(stack_path, "rb") as f:
        f.seek(start)
        text = f.read().decode("utf-8", errors="replace")
    frames = parse_faulthandler(text, marker.get("main_thread"))
    if not frames:
        raise StackError(f"faulthandler: pid {pid} wrote no stack within {FAULTHANDLER_WAIT_S:g}s")
    return frames


# --- the job's ranks ---------------------------------------------------------------------------

_LAUNCHER = re.compile(r"torch\.distributed\.(run|launch)|(^|/)torchrun\b|deepspeed\.launcher|accelerate")


@dataclass(frozen=True)
class RankProcess:
    pid: int
    rank: int | None
    local_rank: int | None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except (psutil.Error, OSError):
        return {}


def _global_rank(env: dict[str, str]) -> int | None:
    """RANK, or where a launcher sets only LOCAL_RANK (Lightning's), the rank it implies."""
    rank, local = _int(env.get("RANK")), _int(env.get("LOCAL_RANK"))
    if rank is not None or local is None:
        return rank
    node, per_node = _int(env.get("NODE_RANK") or env.get("GROUP_RANK") or "0"), _int(env.get("LOCAL_WORLD_SIZE"))
    if node == 0:
        return local
    return None if node is None or per_node is None else node * per_node + local


def _is_python(proc: psutil.Process) -> bool:
    try:
        cmd = proc.cmdline()
        return "python" in proc.name().lower() or bool(cmd and "python" in os.path.basename(cmd[0]).lower())
    except (psutil.Error, OSError):
        return False


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except (psutil.Error, OSError):
        return ""


def _spawned_ranks(tree: list[psutil.Process], parents: dict[int, int | None]) -> list[RankProcess]:
    """Ranks started by ``torch.multiprocessing.spawn`` (or Lightning's ddp_spawn), which get
    their rank as an argument, not in the environment: the spawned children of one parent, in
    the order they were started, which is the order of their ranks."""
    spawned = [p for p in tree if "spawn_main" in _cmdline(p)]
    spawned_pids = {p.pid for p in spawned}
    by_parent: dict[int | None, list[psutil.Process]] = {}
    for proc in spawned:
        if parents[proc.pid] not in spawned_pids:  # a DataLoader worker of a spawned rank is no rank
            by_parent.setdefault(parents[proc.pid], []).append(proc)
    if len(by_parent) != 1:
        return []

    def started(proc: psutil.Process) -> float:
        try:
            return proc.create_time()
        except psutil.Error:
            return 0.0

    children = sorted(next(iter(by_parent.values())), key=lambda p: (started(p), p.pid))
    return [RankProcess(p.pid, rank, rank) for rank, p in enumerate(children)]


def find_ranks(root_pid: int) -> list[RankProcess]:
    """The rank processes of the job under ``root_pid``.

    A rank has RANK or LOCAL_RANK in its environment and a parent without the same values
    (DataLoader workers and other helpers inherit them). Lightning's own launcher runs rank
    0 in the parent, whose environment names no rank: a Python parent of ranks that is not
    a launcher (torchrun, deepspeed, accelerate) is local rank 0. Processes started by
    multiprocessing's spawn are ranks in the order they started. A job with no rank at all
    (one process) reports its top Python processes.
    """
    try:
        root = psutil.Process(root_pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    environs = {p.pid: _environ(p) for p in tree}
    identity = {pid: (env.get("RANK"), env.get("LOCAL_RANK")) for pid, env in environs.items()}
    parents = {}
    for p in tree:
        try:
            parents[p.pid] = p.ppid()
        except psutil.Error:
            parents[p.pid] = None
    ranks = [p for p in tree if identity[p.pid] != (None, None) and identity.get(parents[p.pid]) != identity[p.pid]]
    found = [RankProcess(p.pid, _global_rank(environs[p.pid]), _int(identity[p.pid][1])) for p in ranks]
    by_pid = {p.pid: p for p in tree}
    rank_parents = {parents[p.pid] for p in ranks}
    for pid in rank_parents:
        proc = by_pid.get(pid)
        if proc is None or identity[pid] != (None, None) or not _is_python(proc):
            continue
        try:
            launcher = _LAUNCHER.search(" ".join(proc.cmdline()))
        except psutil.Error:
            continue
        if not launcher:
            children = [r.rank for r in found if r.rank is not None and parents[r.pid] == pid]
            found.append(RankProcess(pid, min(children) - 1 if children else None, 0))
    if not found:
        found = _spawned_ranks(tree, parents)
    if not found:
        pythons = [p for p in tree if _is_python(p)]
        python_pids = {p.pid for p in pythons}
        found = [RankProcess(p.pid, None, None) for p in pythons if parents[p.pid] not in python_pids]
    return sorted(found, key=lambda r: (r.rank is None, r.rank or 0, r.local_rank or 0, r.pid))


# --- Flight Recorder --------------------------------------------------------------------------


class _NoClasses(pickle.Unpickler):
    """Flight Recorder pickles hold only plain data; anything else is refused, never run."""

    def find_class(self, module: str, name: str):  # noqa: ARG002
        raise pickle.UnpicklingError(f"refused class {module}.{name}")


def _load_dump(path: Path) -> dict | None:
    data = path.read_bytes()
    if data[:1] in (b"{", b"["):
        try:
            dump = json.loads(data)
        except ValueError:
            return None
    else:
        try:
            dump = _NoClasses(io.BytesIO(data)).load()
        except Exception:  # noqa: BLE001 - any malformed or foreign file is skipped
            return None
    if not isinstance(dump, dict) or "version" not in dump:
        return None
    return dump  # a rank that ran no collective yet has no "entries" at all


def _collective(entry: dict) -> Collective:
    p2p = bool(entry.get("is_p2p"))
    seq = entry.get("p2p_seq_id" if p2p else "collective_seq_id")
    name = str(entry.get("profiling_name") or "")
    group = entry.get("process_group")
    pg = str(group[1] or group[0]) if isinstance(group, (list, tuple)) and len(group) == 2 else None
    frames = [
        Frame(file=str(f.get("filename", "?")), line=f.get("line"), function=f.get("name"))
        for f in entry.get("frames") or []
        if isinstance(f, dict)
    ]
    sizes = entry.get("input_sizes")
    return Collective(
        seq=seq if isinstance(seq, int) else None,
        op=name.split(":", 1)[-1] or None,
        state=entry.get("state"),
        pg=pg,
        frame=user_frame(frames),
        sizes=sizes
        if isinstance(sizes, list) and all(isinstance(x, list) and all(isinstance(d, int) for d in x) for x in sizes)
        else None,
    )


_DUMP_NAME = re.compile(r"(?:rank_?|_)(\d+)(?:\.json)?$")


def read_flight_recorder(folder: Path) -> tuple[dict[int, list[Collective]], list[Straggler]]:
    """Per rank its recorded collectives (oldest first), and the stragglers across ranks."""
    per_rank: dict[int, list[Collective]] = {}
    if not folder.is_dir():
        return per_rank, []
    for path in sorted(folder.iterdir()):
        match = _DUMP_NAME.search(path.name)
        if not match or not path.is_file():
            continue
        dump = _load_dump(path)
        if dump is None:
            continue
        entries = [_collective(e) for e in dump.get("entries") or [] if isinstance(e, dict)]
        per_rank[int(match.group(1))] = entries
    return per_rank, stragglers(per_rank)


def stragglers(per_rank: dict[int, list[Collective]]) -> list[Straggler]:
    """Per process group, the first collective that some dumped ranks entered and others did not.

    Every rank that dumped counts as a member of every group seen (a rank that never reached
    a group's first collective has no entry for it); fine for the default group, an
    over-approximation for subgroups.
    """
    last: dict[str | None, dict[int, int]] = {}
    for rank, entries in per_rank.items():
        for entry in entries:
            if entry.seq is None or entry.op in ("send", "recv"):
                continue
            seqs = last.setdefault(entry.pg, {})
            seqs[rank] = max(seqs.get(rank, 0), entry.seq)
    found = []
    for pg, seqs in last.items():
        by_rank = {rank: seqs.get(rank, 0) for rank in per_rank}
        low = min(by_rank.values())
        entered = sorted(r for r, seq in by_rank.items() if seq > low)
        if entered:
            op = _op_at(per_rank, entered[0], pg, low + 1)
            missing = sorted(r for r in by_rank if r not in entered)
            found.append(Straggler(pg=pg, seq=low + 1, op=op, entered=entered, missing=missing))
        if low:
            # every rank got as far as ``low``: did they all call the same collective there?
            ops = {str(r): _op_at(per_rank, r, pg, low) or "?" for r in sorted(by_rank)}
            if len(set(ops.values())) > 1:
                found.append(Straggler(pg=pg, seq=low, entered=sorted(by_rank), ops=ops))
    return found


def _op_at(per_rank: dict[int, list[Collective]], rank: int, pg: str | None, seq: int) -> str | None:
    return next((c.op for c in per_rank[rank] if c.pg == pg and c.seq == seq), None)


def request_flight_recorder(hook_dir: Path, pids: Iterable[int], wait_s: float = FR_WAIT_S) -> int:
    """Ask each rank's hook to dump its Flight Recorder; returns how many were asked. Waits
    until each has answered (``PID.fr-done``: dumped, or nothing to dump before
    init_process_group), at most ``wait_s``."""
    asked: list[Path] = []
    for pid in pids:
        fifo = hook_dir / f"{pid}.fr"
        answer = hook_dir / f"{pid}.fr-done"
        answer.unlink(missing_ok=True)
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO when no hook listens
        except OSError:
            continue
        try:
            os.write(fd, b"dump\n")
            asked.append(answer)
        except OSError:
            pass
        finally:
            os.close(fd)
    deadline = time.monotonic() + wait_s
    while asked and time.monotonic() < deadline and not all(a.exists() for a in asked):
        time.sleep(0.05)
    return len(asked)


# --- the Flight Recorder as sequences ----------------------------------------------------------


def _key(c: Collective) -> tuple:
    return c.op, json.dumps(c.sizes)


def sequence(per_rank: dict[int, list[Collective]], stacks: Sequence[RankStack] = ()) -> str | None:
    """Where the ranks' collective sequences part, in the terms of ``Hang.sequence``.

    The default group's collectives (the first group every rank recorded) are compared
    sequence number by sequence number. At the first number where they differ: one op with
    different shapes is a size mismatch; on one side a collective the ranks had already
    repeated (same op, same shapes: a training step's) and on the other something else, or
    nothing because the rank exited, is uneven iterations; other differing ops are divergent
    code. Ranks that agree all along but some went further: a rank behind, unless it exited
    and the others repeat a step's collective (uneven again).
    """
    series = {
        rank: {c.seq: c for c in entries if c.seq is not None and c.op not in ("send", "recv")}
        for rank, entries in per_rank.items()
    }
    if not any(series.values()):
        return None
    pgs = [{c.pg for c in s.values()} for s in series.values() if s]
    pg = sorted(set.intersection(*pgs), key=str)[0] if set.intersection(*pgs) else None
    # a rank that dumped but issued nothing in the group yet stands at sequence number 0
    series = {
        rank: {0: Collective(seq=0), **{seq: c for seq, c in s.items() if c.pg == pg}} for rank, s in series.items()
    }
    exited = any(st.activity == "exited" for st in stacks)

    def continues(rank: int, seq: int) -> bool:
        """Whether the rank's collective at ``seq`` carries on the pattern its collectives
        repeated just before (a training step's: the same ops, the same shapes)."""
        history = [_key(series[rank][n]) for n in range(seq - 2 * MAX_STEP_OPS, seq) if n in series[rank]]
        for period in range(1, MAX_STEP_OPS + 1):
            if len(history) >= 2 * period and history[-period:] == history[-2 * period : -period]:
                return seq in series[rank] and _key(series[rank][seq]) == history[-period]
        return False

    low = min(max(s) for s in series.values())
    high = max(max(s) for s in series.values())
    start = max(min(s) for s in series.values())
    for seq in range(start, low + 1):
        at = {rank: s.get(seq) for rank, s in series.items()}
        if any(c is None for c in at.values()):
            continue  # fell out of one rank's ring buffer
        if len({_key(c) for c in at.values()}) == 1:
            continue
        if len({c.op for c in at.values()}) == 1:
            return "size-mismatch"
        step = [rank for rank in at if continues(rank, seq)]
        return "uneven-iterations" if step and len(step) < len(at) else "different-ops"
    if high == low:
        return "uneven-iterations" if exited and all(continues(rank, low) for rank in series) else "in-step"
    ahead = [rank for rank, s in series.items() if max(s) > low]
    if exited and all(continues(rank, low + 1) for rank in ahead):
        return "uneven-iterations"
    return "rank-behind"


def slow_ranks(stacks: Sequence[RankStack]) -> list[int]:
    """Ranks busy with their own work while every other rank waits in a collective."""
    waiting = [s for s in stacks if s.activity == "collective"]
    busy = [s for s in stacks if s.activity in ("compute", "io", "data")]
    if not waiting or not busy or len(waiting) + len(busy) != len(stacks):
        return []
    return sorted(s.rank for s in busy if s.rank is not None)


# --- the job's own source: branches only some ranks take ---------------------------------------

_RANK_TEST = re.compile(
    r"\b(global_rank|local_rank|node_rank|rank|is_global_zero|is_local_zero|is_main_process|is_local_main_process|"
    r"process_index|local_process_index|get_rank\(\)|RANK|LOCAL_RANK)\b"
)
_RANK_DECORATOR = re.compile(r"\brank_zero_only\b|\bon_main_process\b|\bon_local_main_process\b")
# calls every rank must make: torch.distributed, Lightning, Fabric, accelerate
_SYNC_CALLS = frozenset(
    {
        "barrier",
        "monitored_barrier",
        "all_reduce",
        "all_gather",
        "all_gather_object",
        "all_gather_into_tensor",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_to_all",
        "all_to_all_single",
        "wait_for_everyone",
        "gather_for_metrics",
        "reduce_boolean_decision",
    }
)
_SYNC_IF_KEYWORD = {"log": "sync_dist", "log_dict": "sync_dist"}  # self.log(..., sync_dist=True)
MAX_SOURCE_BYTES = 2_000_000


@functools.lru_cache(maxsize=64)
def _branches(path: str) -> tuple[tuple[int, int, str], ...]:
    """(first line, last line, test) of each stretch of a file only some ranks run: the body
    of an ``if`` on a rank (its ``else`` too), a ``rank_zero_only`` function."""
    try:
        with open(path, "rb") as f:
            source = f.read(MAX_SOURCE_BYTES + 1)
        if len(source) > MAX_SOURCE_BYTES:
            return ()
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return ()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if _RANK_TEST.search(test):
                for body in (node.body, node.orelse):
                    if body:
                        found.append((body[0].lineno, body[-1].end_lineno or body[-1].lineno, f"if {test}:"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                text = ast.unparse(decorator)
                if _RANK_DECORATOR.search(text):
                    found.append((node.body[0].lineno, node.end_lineno or node.lineno, f"@{text}"))
    return tuple(found)


def rank_branch(frames: Sequence[Frame]) -> str | None:
    """The test of the innermost rank-only branch any user frame of a stack sits in."""
    for frame in frames:
        if frame.line is None or is_library(frame.file):
            continue
        inside = [b for b in _branches(frame.file) if b[0] <= frame.line <= b[1]]
        if inside:
            return min(inside, key=lambda b: b[1] - b[0])[2]
    return None


def _sync_call(node: ast.Call) -> str | None:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name in _SYNC_CALLS:
        return ast.unparse(func)
    keyword = _SYNC_IF_KEYWORD.get(name or "")
    if keyword and any(
        k.arg == keyword and isinstance(k.value, ast.Constant) and k.value.value is True for k in node.keywords
    ):
        return ast.unparse(func)
    return None


def rank_zero_calls(paths: Iterable[str]) -> list[SourceCall]:
    """Calls that synchronise ranks inside branches only some ranks take, in these files."""
    found = []
    for path in sorted(set(paths)):
        branches = _branches(path)
        if not branches:
            continue
        tree = ast.parse(Path(path).read_bytes())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            call = _sync_call(node)
            inside = [b for b in branches if b[0] <= node.lineno <= b[1]]
            if call and inside:
                found.append(
                    SourceCall(
                        file=path, line=node.lineno, call=call, condition=min(inside, key=lambda b: b[1] - b[0])[2]
                    )
                )
    return found


def _user_files(stacks: Sequence[RankStack]) -> set[str]:
    files = {f.file for s in stacks for f in s.frames if not is_library(f.file) and os.path.isfile(f.file)}
    files |= {c.frame.file for s in stacks for c in s.collectives or [] if c.frame and os.path.isfile(c.frame.file)}
    return files


# --- a crash: the first failing rank's own traceback ----------------------------------------------

_TERMINATE = re.compile(r"^terminate called after throwing an instance of '([\w:.<>]+)'")
_WHAT = re.compile(r"^\s+what\(\):\s+(.*)$")
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.:]*)(?::\s*(?P<message>.*))?$")
TRACEBACK_MAX_LINES = 400
MAX_TRACEBACKS = 8


def tracebacks(lines: Iterable[str]) -> list[tuple[int | None, list[str]]]:
    """The Python tracebacks of a job's output (and C++ exceptions that aborted a process),
    in the order they ended, each with the rank its ``[rankN]:`` prefix names (None without
    one) and its lines, prefixes removed."""
    open_: dict[int | None, list[str]] = {}
    uncaught: dict[int | None, str] = {}
    done: list[tuple[int | None, list[str]]] = []
    for raw in lines:
        line = raw.rstrip("\n")
        m = RANK_PREFIX.match(line)
        rank, text = (int(m.group(1)), line[m.end() :]) if m else (None, line)
        if text.startswith("Traceback (most recent call last):"):
            open_[rank] = [text]
            continue
        if rank not in open_ and _TB_FRAME.match(text):
            # a traceback pasted without its first line starts at its first frame
            open_[rank] = ["Traceback (most recent call last):"]
        aborted = _TERMINATE.match(text)
        if aborted:  # a C++ exception no Python code caught: the process aborts (SIGABRT)
            uncaught[rank] = aborted.group(1)
            continue
        what = _WHAT.match(text)
        if what and rank in uncaught:
            done.append((rank, [f"{uncaught.pop(rank)}: {what.group(1)}"]))
            continue
        block = open_.get(rank)
        if block is None:
            continue
        block.append(text)
        if text[:1].strip() and _EXCEPTION.match(text) and len(block) > 1:
            done.append((rank, block))
            del open_[rank]
            if len(done) >= MAX_TRACEBACKS:
                break
        elif len(block) > TRACEBACK_MAX_LINES:
            del open_[rank]
    # a traceback cut short (a pasted excerpt, a killed process) still shows where it was
    done.extend((rank, block) for rank, block in open_.items() if any(map(_TB_FRAME.match, block)))
    return done[:MAX_TRACEBACKS]


_TB_FRAME = re.compile(r'^\s+File "(.*)", line (\d+), in (.+)$')


def first_failure(lines: Iterable[str], rank: int | None, read: Callable[[str], object]) -> Failure | None:
    """The exception of ``rank`` (or, unknown, of the first traceback to end), put through
    the signature catalog with ``read`` (``probes.log.log_from_text``)."""
    blocks = tracebacks(lines)
    mine = [b for r, b in blocks if rank is None or r == rank] or [b for _, b in blocks[:1]]
    if not mine:
        return None
    first = mine[0]
    kind = _EXCEPTION.match(first[-1])
    frames = [
        Frame(file=m.group(1), line=int(m.group(2)), function=m.group(3)) for m in map(_TB_FRAME.match, first) if m
    ]
    # the exception and its message, not the source lines a traceback quotes: the user's own
    # code says nothing about what went wrong and may hold any word
    log = read("\n".join(line for block in mine for line in _without_code(block)))
    ids = sorted({sig.id for sig in log.signatures or []})
    return Failure(
        rank=rank if rank is not None else next((r for r, b in blocks if b is first), None),
        exception=kind.group("type") if kind else None,
        message=(kind.group("message") or "")[:300] if kind else None,
        user_frame=user_frame(frames[::-1]),
        library=frame_library(frames[::-1]),
        signatures=ids,
        explained=any(i not in GENERIC_SIGNATURES for i in ids),
    )


def _without_code(block: list[str]) -> list[str]:
    kept, skip = [], False
    for line in block:
        if _TB_FRAME.match(line):
            skip = True  # its next indented lines quote the source (and carets)
            continue
        if skip and line[:1].isspace():
            continue
        skip = False
        kept.append(line)
    return kept


# Signatures that say an exception happened, not what it was: they leave the cascade
# ("a rank failed first") as the answer.
GENERIC_SIGNATURES = frozenset({"python_exception"})


# --- the whole ------------------------------------------------------------------------------


def _one_stack(
    proc: RankProcess, methods: Sequence[str], py_spy: str | None, hook_dir: Path | None, host: str
) -> tuple[RankStack, list[str]]:
    notes: list[str] = []
    for method in methods:
        try:
            if method == "py-spy":
                if py_spy is None:
                    raise StackError("py-spy: not installed")
                frames, state = pyspy_stack(proc.pid, py_spy)
            elif method == "faulthandler":
                if hook_dir is None:
                    raise StackError("faulthandler: the job was started without the diagnose hook")
                frames, state = faulthandler_stack(proc.pid, hook_dir), None
            else:
                raise ValueError(f"unknown stack method {method!r}")
        except StackError as exc:
            notes.append(str(exc) + (" (ptrace refused)" if exc.refused else ""))
            continue
        stack = rank_stack(
            frames, rank=proc.rank, local_rank=proc.local_rank, pid=proc.pid, host=host, method=method, state=state
        )
        return stack, notes
    return RankStack(rank=proc.rank, local_rank=proc.local_rank, pid=proc.pid, host=host, state="unavailable"), notes


def take_stacks(
    procs: Sequence[RankProcess],
    *,
    hook_dir: Path | None = None,
    py_spy: str | None = None,
    methods: Sequence[str] = ("py-spy", "faulthandler"),
) -> tuple[list[RankStack], list[str]]:
    """Each rank's stack, in parallel; and why a method failed where one did."""
    if not procs:
        return [], []
    host = socket.gethostname()
    with ThreadPoolExecutor(max_workers=min(8, len(procs))) as pool:
        results = list(pool.map(lambda p: _one_stack(p, methods, py_spy, hook_dir, host), procs))
    return [stack for stack, _ in results], sorted({note for _, ns in results for note in ns})


# Where a rank waits on its peers. A rank that stays at the same such place for a whole
# window is not making progress even while it burns a core (NCCL busy-waits).
PEER_WAITS = frozenset(
    {
        "barrier",
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "reduce",
        "gather",
        "scatter",
        "all_to_all",
        "send",
        "recv",
        "verify_params",
        "init_process_group",
        "rendezvous",
        "cuda_sync",
    }
)


STARTUP_WAITS = frozenset({"rendezvous", "init_process_group"})


def spin_signature(stacks: Sequence[RankStack]) -> tuple | None:
    """What must stay the same between two looks for busy ranks to count as stuck: the place
    and innermost frame of every rank that waits on its peers (a rank busy with its own work
    meanwhile, a slow evaluation, moves; the ones waiting for it do not); None unless some
    rank waits on its peers."""
    waiting = [s for s in stacks if s.waiting_in in PEER_WAITS]
    elsewhere = [s for s in stacks if s.waiting_in not in PEER_WAITS]
    if not waiting:
        return None
    if elsewhere and (
        any(s.waiting_in in STARTUP_WAITS for s in waiting) or any(s.waiting_in == "import" for s in elsewhere)
    ):
        return None  # ranks waiting at start-up for one still importing or loading: starting, not stuck
    return tuple(
        sorted(
            (s.pid or 0, s.waiting_in or "", *((s.frames[0].file, s.frames[0].line) if s.frames else ()))
            for s in waiting
        )
    )


def collect_hang(
    root_pid: int,
    *,
    hook_dir: Path | None = None,
    fr_dir: Path | None = None,
    py_spy: str | None = None,
    methods: Sequence[str] = ("py-spy", "faulthandler"),
    known: Sequence[RankProcess] = (),
) -> Hang:
    """Stacks (and Flight Recorder records) of every rank of the job under ``root_pid``;
    ``known``: ranks seen earlier, reported ``exited`` when they are gone."""
    hang = Hang(source="hang", detected=True)
    procs = find_ranks(root_pid)
    if not procs:
        hang.ranks = []
        hang.unavailable["ranks"] = "no Python process left in the job's tree"
        return hang
    live_ranks = {p.rank for p in procs if p.rank is not None}
    gone = [p for p in known if p.rank is not None and p.rank not in live_ranks and not psutil.pid_exists(p.pid)]
    if fr_dir is not None and hook_dir is not None:
        request_flight_recorder(hook_dir, [p.pid for p in procs])
    hang.ranks, notes = take_stacks(procs, hook_dir=hook_dir, py_spy=py_spy, methods=methods)
    if any(s.state == "unavailable" for s in hang.ranks):
        hang.unavailable["ranks.frames"] = "; ".join(notes) or "no stack method worked"
    elif notes:
        hang.unavailable["ranks.method"] = "fell back: " + "; ".join(notes)
    hang.ranks += [
        RankStack(rank=p.rank, local_rank=p.local_rank, pid=p.pid, state="exited", activity="exited")
        for p in {p.rank: p for p in gone}.values()
    ]
    per_rank: dict[int, list[Collective]] = {}
    if fr_dir is not None:
        per_rank, found = read_flight_recorder(fr_dir)
        for stack in hang.ranks:
            if stack.rank in per_rank:
                stack.collectives = per_rank[stack.rank][-LAST_COLLECTIVES:]
        if per_rank:
            hang.stragglers = found
            hang.sequence = sequence(per_rank, hang.ranks)
    hang.slow_ranks = slow_ranks(hang.ranks)
    hang.rank_zero_calls = rank_zero_calls(_user_files(hang.ranks))
    return hang
