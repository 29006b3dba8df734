"""The ``torch`` section: how the installed torch was built, and whether CUDA comes up.

Asked in a child interpreter under a deadline: a broken driver can hang or kill the
process on CUDA init, and that must become a fact, not a hang of the tool. The child
reports in two stages (build facts, which never touch the driver, then CUDA init), so a
hang in the second still leaves the first; and ``torch/version.py``, read as text before
the child starts, still gives the version and CUDA build when the import itself fails.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from probes import runner
from probes.facts import TorchBuild

MARK = "@@diagnose-torch@@ "

# Kept in one string so the child needs nothing from this package; each line is one JSON
# object after MARK, flushed, so a kill mid-way loses only the unfinished stage.
CHILD = f"""
import importlib, json, sys, warnings
MARK = {MARK!r}
def say(**facts):
    print(MARK + json.dumps(facts), flush=True)
def attempt(fn):
    try:
        return fn()
    except Exception:
        return None
import torch
dist = torch.distributed
backends = []
if attempt(dist.is_available):
    for name in ("nccl", "gloo", "mpi", "ucc", "xccl"):
        check = getattr(dist, "is_" + name + "_available", None)
        if check is not None and attempt(check):
            backends.append(name)
nccl = attempt(lambda: importlib.import_module("torch.cuda.nccl").version()) if torch.version.cuda else None
flags = attempt(torch._C._cuda_getArchFlags) if hasattr(torch._C, "_cuda_getArchFlags") else None
cudnn = attempt(torch.backends.cudnn.version)
say(
    stage="build",
    version=torch.__version__,
    cuda=torch.version.cuda,
    hip=getattr(torch.version, "hip", None),
    cudnn=cudnn,
    nccl=list(nccl) if isinstance(nccl, tuple) else nccl,
    arch_list=flags.split() if flags else [],
    backends=backends,
)
try:
    # a failed init is a warning, not an error: "CUDA initialization: The NVIDIA driver
    # on your system is too old ..." is the most useful sentence torch has to say here
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    said = [str(w.message) for w in caught if "CUDA" in str(w.message)]
    say(stage="cuda", cuda_available=available, device_count=count, warning=said[0] if said else None)
except Exception as exc:
    say(stage="cuda", error=type(exc).__name__ + ": " + str(exc))
"""


def find_torch() -> list[str] | None:
    """The folders this interpreter would import torch from; None when torch is not installed."""
    spec = importlib.util.find_spec("torch")
    return None if spec is None else list(spec.submodule_search_locations or [])


def probe(
    run: runner.Runner = runner.run,
    timeout: float = 20.0,
    python: Sequence[str] = (sys.executable,),
    find: Callable[[], Sequence[str] | None] | None = find_torch,
) -> TorchBuild:
    """``python`` is the interpreter argv to ask. Only when its child reports no build does
    ``find`` say where this interpreter's torch lies (asked when ``python`` is this interpreter):
    nowhere, torch is not installed; else its version.py still names the build. Tests pass
    stand-ins for all three."""
    facts = TorchBuild(source="live")
    result = run([*python, "-c", CHILD], timeout)
    stages = _stages(result.stdout)
    build, cuda = stages.get("build"), stages.get("cuda")
    if build:
        _fill_build(facts, build)
    elif find is not None and tuple(python) == (sys.executable,):
        locations = find()
        if locations is None:
            return TorchBuild(source="live", unavailable={"version": "torch is not installed in this environment"})
        _fill_static(facts, locations)
    if cuda and "error" not in cuda:
        facts.cuda_available = cuda["cuda_available"]
        facts.device_count = cuda["device_count"]
        facts.init_error = cuda.get("warning")
    elif cuda:
        facts.init_error = cuda["error"]
    else:
        facts.init_error = _why(result, "importing torch" if not build else "CUDA init", timeout)
    if not build:
        for field in ("version", "cuda", "cudnn", "nccl", "cuda_build", "arch_list", "backends"):
            # with version.py read, a None cuda means a CPU build, not unknown
            if getattr(facts, field) is None and not (field == "cuda" and facts.version):
                facts.unavailable[field] = facts.init_error
    if not cuda or "error" in cuda:
        facts.unavailable["cuda_available"] = facts.init_error
        facts.unavailable["device_count"] = facts.init_error
    return facts


def _stages(stdout: str) -> dict[str, dict]:
    stages: dict[str, dict] = {}
    for line in stdout.splitlines():
        if line.startswith(MARK):
            try:
                data = json.loads(line[len(MARK) :])
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            stages[data.pop("stage", "")] = data
    return stages


def _fill_build(facts: TorchBuild, build: dict) -> None:
    facts.version = build["version"]
    facts.cuda = build["cuda"]
    facts.hip = build["hip"]
    facts.cuda_build = bool(build["cuda"] or build["hip"])
    facts.cudnn = _cudnn_version(build["cudnn"])
    nccl = build["nccl"]
    facts.nccl = ".".join(str(p) for p in nccl) if isinstance(nccl, list) else (str(nccl) if nccl else None)
    if facts.cuda_build and facts.nccl is None:
        facts.unavailable["nccl"] = "torch reports no NCCL version"
    if facts.cuda_build and facts.cudnn is None:
        facts.unavailable["cudnn"] = "torch reports no cuDNN version"
    facts.arch_list = build["arch_list"]
    facts.backends = build["backends"]


def _fill_static(facts: TorchBuild, locations: Sequence[str]) -> None:
    """What ``torch/version.py`` says, read as text: still known when the import then fails."""
    for location in locations:
        try:
            tree = ast.parse((Path(location) / "version.py").read_text())
        except (OSError, SyntaxError, ValueError):
            continue
        found: dict[str, object] = {}
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found.update({t.id: node.value.value for t in targets if isinstance(t, ast.Name)})
        if isinstance(found.get("__version__"), str):
            facts.version = found["__version__"]
            facts.cuda = found.get("cuda") if isinstance(found.get("cuda"), str) else None
            facts.hip = found.get("hip") if isinstance(found.get("hip"), str) else None
            facts.cuda_build = bool(facts.cuda or facts.hip)
            return


def _cudnn_version(raw: int | None) -> str | None:
    """torch reports cuDNN as one integer: 8902 is 8.9.2, 90100 is 9.1.0."""
    if not raw:
        return None
    major, rest = (raw // 10000, raw % 10000) if raw >= 90000 else (raw // 1000, raw % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _why(result: runner.Result, stage: str, timeout: float) -> str:
    if result.error:
        return f"could not start the torch child: {result.error}"
    if result.timed_out:
        return f"torch {stage} timed out after {timeout:g} s (killed)"
    code = result.returncode
    if code is not None and code < 0:
        try:
            return f"torch {stage} crashed: killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"torch {stage} crashed: killed by signal {-code}"
    last = (result.stderr.strip().splitlines() or [f"exit status {code}"])[-1]
    return f"torch {stage} failed: {last}"
