"""Plan, run and judge the micro-tests; the parent side, which never imports torch."""

from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from probes.facts import MicroTest, MicroTests
from probes.microtests.channel import read_report
from probes.microtests.errors import classify, rendezvous_error_kind
from probes.microtests.group import GroupPlan, Run, Step, run_group
from probes.microtests.judge import judge
from probes.microtests.watchdog import Launch, run_launches, who

TEST_NAMES = ("rendezvous", "barrier", "all_reduce", "placement", "duplicate_gpu", "lightning_fit")
STRATEGIES = ("ddp", "ddp_spawn", "fsdp", "deepspeed")
BACKENDS = ("gloo", "nccl")
# Re-run under these when a collective fails or hangs on NCCL: which one passes names the cause.
VARIANTS: dict[str, dict[str, str]] = {
    "p2p_disabled": {"NCCL_P2P_DISABLE": "1"},
    "shm_disabled": {"NCCL_SHM_DISABLE": "1"},
    "ib_disabled": {"NCCL_IB_DISABLE": "1"},
}
_COLLECTIVES = ("rendezvous", "barrier", "all_reduce")
_PROBES_ROOT = Path(__file__).resolve().parents[2]
# Set by launchers around a job; inside our own ranks they would mislead torch or Lightning.
_LAUNCHER_VARS = re.compile(
    r"(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|NODE_RANK|MASTER_ADDR|MASTER_PORT"
    r"|(TORCHELASTIC|SLURM|OMPI|PMI|PMIX)_\w*)"
)
_ERROR_LINE = re.compile(r"Error\b|error:|Fatal Python error")
_CPP_TRACE = re.compile(r"\s*Exception raised from .*", re.DOTALL)
_MAX_ERROR = 600
# Importing torch from a cold disk can take this long on its own: the ranks get at least this
# long to say what they found, whatever the tests' own deadline.
ANSWER_LIMIT_S = 30.0

Progress = Callable[[str, str, "str | None"], None]


@dataclass
class Setup:
    """What the environment allows, from one probe child."""

    info: dict
    backend: str | None
    nproc: int
    cuda_devices: int
    skip_all: str | None = None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not _LAUNCHER_VARS.fullmatch(k)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PROBES_ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def plan(info: dict, nproc: int | None, backend: str | None) -> Setup:
    cuda = info.get("device_count", 0) if info.get("cuda") else 0
    backend = backend or ("nccl" if cuda and info.get("nccl") else "gloo")
    unusable = _unusable(info, backend, cuda)
    if unusable:
        return Setup(info, backend, nproc or 2, cuda, skip_all=unusable)
    return Setup(info, backend, nproc or (cuda if backend == "nccl" else 2), cuda)


def _unusable(info: dict, backend: str, cuda: int) -> str | None:
    if "query_error" in info:
        return info["query_error"]
    if "torch_error" in info:
        return f"torch cannot be imported by {info.get('python')}: {info['torch_error']}"
    if not info.get("distributed"):
        return "torch.distributed is not available in this torch build"
    if not info.get(backend):
        return f"this torch build has no {backend} backend"
    if backend == "nccl" and not cuda:
        return "the nccl backend needs a CUDA GPU; none is visible"
    return None


def _skip_reason(name: str, setup: Setup, strategy: str) -> str | None:
    if setup.skip_all:
        return setup.skip_all
    if name in ("placement", "duplicate_gpu") and not setup.cuda_devices:
        return "needs a CUDA GPU; torch sees none"
    if name == "duplicate_gpu" and setup.cuda_devices == 1 and setup.backend != "nccl":
        return "on a single GPU this asks NCCL about two ranks sharing it; the backend is gloo"
    if name == "lightning_fit":
        if not setup.info.get("lightning"):
            return "neither lightning nor pytorch_lightning is installed"
        if strategy in ("fsdp", "deepspeed") and not (setup.cuda_devices and setup.backend == "nccl"):
            return f"Lightning's {strategy} strategy needs CUDA GPUs and NCCL"
        if strategy == "deepspeed" and not setup.info.get("deepspeed"):
            return "the deepspeed strategy needs the deepspeed package, which is not installed"
    return None


def _device(name: str, rank: int, backend: str, setup: Setup, shared: bool) -> str:
    if name in ("placement", "duplicate_gpu") or backend == "nccl":
        return "cuda:0" if shared else f"cuda:{rank % setup.cuda_devices}"
    return "cpu"


def layout(name: str, setup: Setup, strategy: str) -> tuple[int, bool, bool]:
    """(ranks, all on one shared GPU, Lightning spawns the ranks) for one test."""
    shared = name == "duplicate_gpu" and setup.cuda_devices == 1
    nproc = 2 if shared else max(2, setup.nproc) if name == "duplicate_gpu" else setup.nproc
    return nproc, shared, name == "lightning_fit" and strategy == "ddp_spawn"


def launches(
    name: str,
    setup: Setup,
    *,
    backend: str,
    strategy: str,
    port: int,
    deadline: float,
    work: str,
    extra_env: dict[str, str] | None = None,
) -> list[Launch]:
    """The processes of one test: one per rank, or one that Lightning's spawn launcher grows."""
    nproc, shared, spawn = layout(name, setup, strategy)
    base = [
        sys.executable, "-m", "probes.microtests.worker", "--test", name,
        "--world-size", str(nproc), "--backend", backend, "--port", str(port),
        "--deadline", repr(deadline), "--out", work, "--parent-pid", str(os.getpid()),
        "--strategy", strategy, "--mode", "shared" if shared else "distinct",
    ]  # fmt: skip
    env = child_env(extra_env)
    if spawn:
        device = "cuda" if backend == "nccl" else "cpu"
        return [Launch("launcher", [*base, "--device", device], env)]
    return [
        Launch(
            rank,
            [*base, "--rank", str(rank), "--device", _device(name, rank, backend, setup, shared)],
            env,
        )
        for rank in range(nproc)
    ]


def execute(
    name: str,
    setup: Setup,
    *,
    backend: str,
    timeout: float,
    strategy: str = "ddp",
    extra_env: dict[str, str] | None = None,
) -> Run:
    """Start the ranks of one test, watch them, and collect what they reported (a port
    another process took in the meantime: once more)."""
    nproc, shared, spawn = layout(name, setup, strategy)
    for attempt in range(2):
        with tempfile.TemporaryDirectory(prefix="diagnose-microtest-") as work:
            planned = launches(
                name,
                setup,
                backend=backend,
                strategy=strategy,
                port=free_port(),
                deadline=time.time() + timeout,
                work=work,
                extra_env=extra_env,
            )
            watched = run_launches(planned, Path(work), timeout)
            reports = {rank: read_report(work, rank) for rank in range(nproc)}
            launcher = read_report(work, "launcher") if spawn else None
        extra = {"shared": shared, "strategy": strategy}
        run = Run(watched, reports, launcher, nproc, backend, timeout, extra)
        if attempt or not _port_taken(run):
            return run
    raise AssertionError("unreachable: the second attempt returns")


def _port_taken(run: Run) -> bool:
    """Another process took the free port before rank 0 listened on it: says nothing of the
    machine's training, so the test runs once more on another port."""
    errors = " ".join(r.error or "" for r in [*run.reports.values(), run.launcher] if r)
    return rendezvous_error_kind(errors) == "address_in_use"


def _clean(text: str) -> str:
    text = _CPP_TRACE.sub("", text)
    text = " | ".join(line.strip() for line in text.splitlines() if line.strip())
    return text if len(text) <= _MAX_ERROR else text[: _MAX_ERROR - 3] + "..."


def _last_output_line(run: Run, key) -> str:
    lines = [line for line in run.watched.output.get(key, "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def _telling_line(output: str) -> str | None:
    """The line of a dead rank's output that best says why: a timeout, else an error."""
    lines = [line.strip() for line in reversed(output.splitlines()) if line.strip()]
    for wanted in (lambda line: classify(line)[0], _ERROR_LINE.search):
        for line in lines:
            if wanted(line):
                return line
    return None


def _rank_states(run: Run) -> dict[str, str]:
    states = {}
    for rank, report in run.reports.items():
        step = "done" if report.done else report.last_step
        exit_ = run.exit_of(rank)
        states[str(rank)] = f"{step}; {exit_.describe()}" if exit_ else step
    return states


def verdict(run: Run) -> tuple[str, str | None]:
    """(status, error) of one run. The first failure in time decides: later ones are echoes."""
    exits, first = run.watched.exits, run.watched.failed_first
    for key in first:
        if exits[key].signalled:
            where = run.reports[key].last_step if isinstance(key, int) else "launch"
            error = f"{who(key)} died from {exits[key].describe()} at step '{where}'"
            said = _telling_line(run.watched.output.get(key, ""))
            # NCCL's own watchdog aborts a rank whose collective outlived the group's timeout.
            status = "timed_out" if said and classify(said)[0] else "failed"
            return status, f"{error}: {_clean(said)}" if said else error
    reports = [(k, run.reports.get(k) if isinstance(k, int) else run.launcher) for k in first]
    reported = [(k, r) for k, r in reports if r is not None and r.error]
    if reported:
        key, report = min(reported, key=lambda kr: kr[1].error_time or 0.0)
        return ("timed_out" if report.timeout else "failed"), f"{who(key)}: {_clean(report.error)}"
    if first:
        key = first[0]
        return (
            "failed",
            f"{who(key)} {exits[key].describe()}: {_clean(_last_output_line(run, key))}",
        )
    if run.watched.deadline_hit:
        stuck = [f"rank {r} at '{rep.last_step}'" for r, rep in run.reports.items() if not rep.done]
        return "timed_out", f"no result within {run.timeout:g} s; " + ", ".join(stuck or ["all ranks done"])
    checks = [c for rep in run.reports.values() for c in rep.checks_failed]
    if checks:
        more = f" (and {len(checks) - 1} more wrong results)" if len(checks) > 1 else ""
        return "failed", _clean(checks[0]) + more
    return "passed", None


def judge_run(name: str, run: Run) -> MicroTest:
    """The judge's verdict on a local run, from how its processes ended and what each rank wrote."""
    status, error = verdict(run)
    return judge(
        name,
        run.reports,
        status=status,
        error=error,
        nproc=run.nproc,
        backend=run.backend,
        duration_s=round(run.watched.elapsed_s, 3),
        ranks=_rank_states(run),
        launcher=run.launcher,
        extra=run.extra,
    )


def _detail(test: MicroTest) -> str | None:
    if test.status == "skipped":
        return test.reason
    if test.status != "passed":
        return (test.error or "")[:200] or None
    m = test.measurements
    if "busbw_gbps_max" in m:
        return f"busbw up to {m['busbw_gbps_max']:.2f} GB/s, sums exact"
    return f"{test.nproc} rank{'s' * (test.nproc != 1)}, {test.backend}, {test.duration_s:.1f} s"


def _grouped(name: str, setup: Setup, strategy: str) -> bool:
    """Whether a test can be a step of the group: the group's ranks, each on its own device."""
    nproc, shared, spawn = layout(name, setup, strategy)
    return nproc == setup.nproc and not shared and not spawn


def group_plan(names: list[str], setup: Setup, *, strategy: str, timeout: float) -> GroupPlan:
    """The steps for ``names`` (tests ``_grouped`` allows), each with a port of its own."""
    backend = setup.backend or "gloo"
    steps = [
        Step(name, free_port(), [_device(name, r, backend, setup, False) for r in range(setup.nproc)]) for name in names
    ]
    return GroupPlan(setup.nproc if steps else 0, backend, strategy, timeout, steps)


def _skipped(name: str, setup: Setup, strategy: str) -> MicroTest | None:
    reason = _skip_reason(name, setup, strategy)
    if reason is None:
        return None
    return MicroTest(status="skipped", reason=reason, backend=setup.backend, nproc=setup.nproc)


def _needs_variants(name: str, test: MicroTest) -> bool:
    return name in _COLLECTIVES and test.backend == "nccl" and test.status in ("failed", "timed_out")


def _variants(name: str, setup: Setup, test: MicroTest, *, timeout: float, notify: Progress) -> None:
    for variant, env in VARIANTS.items():
        notify(name, "running", f"variant {variant}")
        test.variants[variant] = verdict(execute(name, setup, backend="nccl", timeout=timeout, extra_env=env))[0]
    notify(name, "running", "variant gloo")
    test.variants["gloo"] = verdict(execute(name, setup, backend="gloo", timeout=timeout))[0]


def _run_test(name: str, setup: Setup, *, timeout: float, strategy: str, notify: Progress) -> MicroTest:
    """One test in a launch of its own: those that cannot be a step of the group."""
    skipped = _skipped(name, setup, strategy)
    if skipped:
        return skipped
    backend = setup.backend
    assert backend is not None
    test = judge_run(name, execute(name, setup, backend=backend, timeout=timeout, strategy=strategy))
    if _needs_variants(name, test):
        _variants(name, setup, test, timeout=timeout, notify=notify)
    return test


class _Suite:
    """One call of ``run_microtests``: the group (started again after a step that failed),
    then the tests that need a launch of their own, progress in the tests' order."""

    def __init__(self, names: list[str], *, nproc, backend, timeout: float, strategy: str, notify: Progress) -> None:
        self.names = names
        self.nproc, self.backend = nproc, backend
        self.timeout, self.strategy = timeout, strategy
        self.notify = notify
        self.result = MicroTests(source="microtest")
        self.setup: Setup | None = None
        self.grouped: list[str] = []
        self.announced: set[str] = set()
        self.retried = False
        self.held: list[tuple[str, MicroTest]] = []  # failed NCCL collectives: variants to run

    def run(self) -> MicroTests:
        try:
            self._groups()
        except Exception as exc:  # an internal failure is a result; the other tests still run
            for name in self.grouped:
                if getattr(self.result, name) is None:
                    self._announce(name)
                    self._record(name, _internal_error(exc))
        for name in self.names:
            if getattr(self.result, name) is None:
                self._announce(name)
                try:
                    assert self.setup is not None
                    test = _run_test(
                        name,
                        self.setup,
                        timeout=self.timeout,
                        strategy=self.strategy,
                        notify=self.notify,
                    )
                except Exception as exc:
                    test = _internal_error(exc)
                self._record(name, test)
        return self.result

    def _groups(self) -> None:
        planned: GroupPlan | Callable[[dict], GroupPlan] = self._plan
        # Where a GPU may be, one process per rank from the start; else rank 0 forks the others.
        workers = (self.nproc or 2) if _gpu_nodes() else 1
        while True:
            info = run_group(
                planned,
                workers=workers,
                answer_limit=max(self.timeout, ANSWER_LIMIT_S),
                env=child_env(),
                on_start=self._on_start,
                on_result=self._on_result,
            )
            if self.setup is None:  # no process ever answered: the plan says why
                self._plan(info)
            assert self.setup is not None
            for name, test in self.held:
                _variants(name, self.setup, test, timeout=self.timeout, notify=self.notify)
                self._record(name, test)
            self.held.clear()
            pending = [name for name in self.grouped if getattr(self.result, name) is None]
            if not pending:
                return
            planned = group_plan(pending, self.setup, strategy=self.strategy, timeout=self.timeout)
            workers = self.setup.nproc if self.setup.cuda_devices else 1

    def _plan(self, info: dict) -> GroupPlan:
        self.setup = plan(info, self.nproc, self.backend)
        self.grouped = [
            name
            for name in self.names
            if _skip_reason(name, self.setup, self.strategy) is None and _grouped(name, self.setup, self.strategy)
        ]
        return group_plan(self.grouped, self.setup, strategy=self.strategy, timeout=self.timeout)

    def _on_start(self, name: str) -> None:
        assert self.setup is not None
        for earlier in self.names[: self.names.index(name)]:
            skipped = earlier not in self.announced and _skipped(earlier, self.setup, self.strategy)
            if skipped:
                self._announce(earlier)
                self._record(earlier, skipped)
        self._announce(name)

    def _on_result(self, name: str, run: Run) -> None:
        try:
            test = judge_run(name, run)
        except Exception as exc:
            test = _internal_error(exc)
        if test.status == "failed" and not self.retried and _port_taken(run):
            self.retried = True  # the next group runs this step again, on another port
            return
        setattr(self.result, name, test)
        if _needs_variants(name, test):
            self.held.append((name, test))  # the group's ranks are still running
        else:
            self._record(name, test)

    def _announce(self, name: str) -> None:
        if name not in self.announced:
            self.announced.add(name)
            self.notify(name, "running", None)

    def _record(self, name: str, test: MicroTest) -> None:
        setattr(self.result, name, test)
        if test.status == "skipped" and test.reason:
            self.result.unavailable[name] = test.reason
        self.notify(name, "failed" if test.status == "error" else test.status, _detail(test))


def _gpu_nodes() -> bool:
    """NVIDIA or ROCm device nodes: torch may well see a GPU (known only once a rank asks)."""
    dev = Path("/dev")
    return any(dev.glob("nvidia[0-9]*")) or (dev / "kfd").exists()


def _internal_error(exc: Exception) -> MicroTest:
    return MicroTest(status="error", error=f"{type(exc).__name__}: {exc}")


def run_microtests(
    names: list[str] | None = None,
    *,
    nproc: int | None = None,
    backend: str | None = None,
    timeout: float = 60.0,
    strategy: str = "ddp",
    progress: Progress | None = None,
) -> MicroTests:
    """Run the named micro-tests (all when None) in order; see the package docstring."""
    selected = list(TEST_NAMES) if names is None else list(names)
    unknown = [n for n in selected if n not in TEST_NAMES]
    if unknown:
        raise ValueError(f"unknown micro-test {unknown[0]!r}; known: {', '.join(TEST_NAMES)}")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if nproc is not None and nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout}")

    def notify(name: str, state: str, detail: str | None) -> None:
        if progress is not None:
            progress(name, state, detail)

    if not selected:
        return MicroTests(source="microtest")
    ordered = [name for name in TEST_NAMES if name in selected]
    return _Suite(ordered, nproc=nproc, backend=backend, timeout=timeout, strategy=strategy, notify=notify).run()
