"""The zoo: small real jobs that fail on 2 CPU ranks with gloo, one documented cause each,
run under `diagnose run` exactly as a user would: each must be named first, the healthy
controls must finish with no finding, and nothing may be left running.

The jobs are written in several styles: plain torch under torchrun, torch.multiprocessing.spawn,
the old torch.distributed.launch, a Lightning Trainer (its own launcher) and Fabric. Jobs
marked ``slow`` (Lightning's start-up dominates them) run when DIAGNOSE_SLOW_TESTS=1.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import pythonpath
from tests.diagnose.test_gpu_gates import GPU_OR_NCCL_ONLY
from tests.diagnose.test_supervise import leftovers

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
JOBS = Path(__file__).parent / "jobs"
HANG_AFTER = "2"
PY = [sys.executable]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
OLD_LAUNCH = [sys.executable, "-m", "torch.distributed.launch", "--nproc-per-node", "2", "--master-port", "{port}"]


@dataclass(frozen=True)
class Job:
    script: str
    launcher: list[str]
    cause: str | None  # None: a healthy control
    outcome: str  # hung, crashed, finished
    args: tuple[str, ...] = ()
    slow: bool = False
    known_miss: str = ""  # why the cause is not named yet: what has to change, and where
    hang_after: str = HANG_AFTER

    def argv(self, port: int) -> list[str]:
        fill = lambda s: s.replace("{port}", str(port))  # noqa: E731
        return [*map(fill, self.launcher), str(JOBS / self.script), *map(fill, self.args)]


ZOO = [
    # hangs
    Job("barrier_rank0_torchrun.py", TORCHRUN, "sync.barrier-divergence", "hung"),
    Job("fabric_barrier_rank0.py", PY, "sync.barrier-divergence", "hung", slow=True),
    Job("lightning_barrier_in_hook.py", PY, "sync.barrier-divergence", "hung", slow=True),
    Job("uneven_shards_loop.py", TORCHRUN, "sync.uneven-batches", "hung"),
    Job("uneven_ddp_spawn.py", PY, "sync.uneven-batches", "hung", args=("{port}",)),
    Job("lightning_uneven_iterable.py", PY, "sync.uneven-batches", "hung", slow=True),
    Job("lightning_log_rank_zero.py", PY, "sync.log-rank-zero-only", "hung", slow=True),
    Job("lightning_all_gather_rank_zero.py", PY, "sync.log-rank-zero-only", "hung", slow=True),
    Job("slow_eval_rank0.py", TORCHRUN, "sync.collective-timeout", "hung"),
    Job("slow_upload_rank0.py", PY, "sync.collective-timeout", "hung", slow=True),
    Job("world_size_too_big.py", PY, "hang.rendezvous-stall", "hung", args=("{port}",)),
    # crashes
    Job("allgather_sizes.py", TORCHRUN, "sync.collective-mismatch", "crashed"),
    # its own 2 s timeout must fire before diagnose's --hang-after does
    Job("gloo_timeout_fires.py", PY, "sync.collective-timeout", "crashed", args=("{port}",), hang_after="8"),
    Job("lightning_unused_parameters.py", PY, "ddp.unused-parameters", "crashed", slow=True),
    Job("ddp_model_differs.py", TORCHRUN, "ddp.param-shape-mismatch", "crashed"),
    Job("collective_before_init.py", TORCHRUN, "launch.process-group-not-initialized", "crashed"),
    Job("old_launcher_local_rank.py", OLD_LAUNCH, "launch.local-rank-argument", "crashed"),
    Job("lightning_spawn_pickling.py", PY, "launch.spawn-pickling", "crashed", slow=True),
    Job("port_in_use.py", PY, "launch.port-in-use", "crashed", args=("{port}",)),
    Job("dataloader_worker_killed.py", TORCHRUN, "dataloader.worker-killed", "crashed"),
    Job("config_keyerror_rank1.py", TORCHRUN, "hang.rank-failed-first", "crashed"),
    Job("mixed_lightning_namespaces.py", PY, "env.lightning-mixed-packages", "crashed", slow=True),
    # healthy controls
    Job("healthy_torchrun.py", TORCHRUN, None, "finished"),
    Job("healthy_fabric.py", PY, None, "finished", slow=True),
    Job("healthy_lightning.py", PY, None, "finished", slow=True),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(job: Job, out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ, HANG_TIMEOUT_S="60", PYTHONPATH=pythonpath(ROOT))
    argv = [
        sys.executable,
        "-m",
        "diagnose",
        "run",
        "--json",
        "--hang-after",
        job.hang_after,
        "--grace",
        "2",
        "--out",
        str(out),
        "--",
        *job.argv(free_port()),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=out.parent, env=env)
    assert not leftovers(out), "diagnose run left processes behind"
    assert not (out / ".hook").exists()
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no JSON report (exit {proc.returncode}): {proc.stderr[-3000:]}") from None
    return proc, report


def marks(job: Job) -> list:
    found = [pytest.mark.xfail(reason=job.known_miss, strict=False)] if job.known_miss else []
    if job.slow and not os.environ.get("DIAGNOSE_SLOW_TESTS"):
        found.append(pytest.mark.skip(reason="slow zoo job; DIAGNOSE_SLOW_TESTS=1 runs it"))
    return found


@pytest.mark.parametrize("job", [pytest.param(j, id=j.script.removesuffix(".py"), marks=marks(j)) for j in ZOO])
def test_zoo_job_is_named_first(job: Job, tmp_path):
    proc, report = run_job(job, tmp_path / "run")
    hang = report["facts"]["hang"]
    found = [f["id"] for f in report["findings"]]
    context = f"{job.script}: findings {found}; stderr: {proc.stderr[-2500:]}"
    assert hang["outcome"] == job.outcome, context
    if job.cause is None:
        assert (proc.returncode, found) == (0, []), context
        return
    assert proc.returncode != 0, context
    if job.outcome == "hung" and job.cause != "hang.rendezvous-stall":
        # caught where the cause shows, not while a rank was still starting up
        places = {r["waiting_in"] for r in hang["ranks"]}
        assert not places & {"import", "rendezvous", "init_process_group"}, context
    assert found and found[0] == job.cause, context
    # what it ran on was seen live, while the job ran
    assert report["facts"]["torch"]["version"] and report["facts"]["gpus"]["source"] == "live", context
    if report["facts"]["gpus"]["count"] == 0:  # on a host with a GPU those causes may rightly be candidates
        wrong = [f for f in found if f.startswith(GPU_OR_NCCL_ONLY)]
        assert not wrong, f"GPU- or NCCL-only causes ranked on a gloo CPU job: {wrong}; {context}"
