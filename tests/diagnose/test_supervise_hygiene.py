"""diagnose run cleans up after itself: real jobs, real signals, checked with psutil.

Every job here is marked by a variable of its own in its environment (``MARK``), so the
check finds what it left behind wherever that ended up: re-parented, in its own session,
double-forked.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.diagnose.test_supervise import marked

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--nnodes",
    "1",
    "--nproc-per-node",
    "2",
    "--rdzv-backend",
    "c10d",
]

DAEMON = """
import os, sys, time
print("job: starting a daemon", flush=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(sys.argv[1], "w") as f:
            f.write(str(os.getpid()))
        while True:
            time.sleep(0.2)
    os._exit(0)
os.wait()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("job: daemon started", flush=True)
if sys.argv[2] == "hang":
    while True:
        time.sleep(0.2)
"""

STUBBORN = """
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("job: ignoring INT and TERM", flush=True)
while True:
    print("job: working", flush=True)
    time.sleep(0.3)
"""

RANKS = """
import os, time
from datetime import timedelta
import torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
print(f"rank {dist.get_rank()}: up", flush=True)
while True:
    time.sleep(0.2)
    print(f"rank {dist.get_rank()}: working", flush=True)
"""


def jobs(mark: str) -> list[psutil.Process]:
    return marked("MARK", mark)


def start(tmp_path: Path, script: str, *args: str, options: tuple[str, ...] = (), command: list[str] | None = None):
    mark = uuid.uuid4().hex
    path = tmp_path / "job.py"
    path.write_text(script)
    out = tmp_path / "out"
    argv = [
        sys.executable,
        "-m",
        "diagnose",
        "run",
        "--json",
        "--grace",
        "1",
        "--out",
        str(out),
        *options,
        "--",
        *(command or [sys.executable]),
        str(path),
        *args,
    ]
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=dict(os.environ, MARK=mark), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, mark, out


def wait_for(proc: subprocess.Popen, out: Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = out / "output.log"
        if log.exists() and text in log.read_text(errors="replace"):
            return
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.1)
    raise AssertionError(f"the job never printed {text!r}")


def gone(mark: str, timeout: float = 10) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (left := jobs(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for proc in left:  # never leave the suite's machine dirty, even when failing
        proc.kill()
    return left


@pytest.mark.parametrize("how", ["finish", "hang"])
def test_a_double_forked_daemon_is_ended_with_the_job(tmp_path, how):
    proc, mark, out = start(tmp_path, DAEMON, str(tmp_path / "daemon.pid"), how, options=("--hang-after", "1"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == (0 if how == "finish" else 1), err[-2000:]
    assert (tmp_path / "daemon.pid").exists()
    assert not gone(mark, timeout=2), "the daemon outlived diagnose run"
    assert not (out / ".hook").exists()


def test_a_second_interrupt_ends_a_job_that_ignores_int_and_term(tmp_path):
    proc, mark, out = start(tmp_path, STUBBORN)
    wait_for(proc, out, "job: working")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert proc.poll() is None and jobs(mark)  # the first one is the job's to handle
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupt again to end it" in err and "ending the job (TERM, KILL after 1s)" in err
    assert not gone(mark, timeout=2)
    assert not (out / ".hook").exists()


def test_sigterm_ends_the_job_removes_the_hook_folder_and_exits_143(tmp_path):
    proc, mark, out = start(tmp_path, STUBBORN)
    wait_for(proc, out, "job: working")
    assert (out / ".hook").is_dir()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err[-2000:]
    assert not gone(mark, timeout=2)
    assert not (out / ".hook").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    return any(
        c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in psutil.net_connections("tcp")
    )


def test_killing_the_supervisor_takes_torchrun_its_ranks_and_their_port(tmp_path):
    pytest.importorskip("torch")
    port = free_port()
    command = [*TORCHRUN, "--rdzv-endpoint", f"127.0.0.1:{port}"]
    proc, mark, out = start(tmp_path, RANKS, command=command, options=("--hang-after", "60"))
    wait_for(proc, out, "rank 1: working")
    assert len(jobs(mark)) >= 3 and listening(port)  # torchrun and two ranks, the store's port open
    proc.kill()
    proc.communicate(timeout=10)
    assert not gone(mark), "torchrun or a rank survived the supervisor"
    assert not listening(port)


def test_keep_leaves_the_job_running_after_diagnose_run_exits(tmp_path):
    """--keep: the parent-death signal that otherwise ends the job with us is not asked for."""
    proc, mark, out = start(
        tmp_path, DAEMON, str(tmp_path / "daemon.pid"), "hang", options=("--hang-after", "1", "--keep")
    )
    try:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, err[-2000:]
        time.sleep(0.5)
        assert len(jobs(mark)) == 2  # the job and its daemon
    finally:
        for left in jobs(mark):
            left.kill()
