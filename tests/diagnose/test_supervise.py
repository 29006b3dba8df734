"""diagnose run: real jobs on 2 CPU ranks with gloo, launched by torchrun, under supervision.

Each job sets a 30 s gloo timeout (HANG_TIMEOUT_S), so a supervisor that missed a hang would
see the job crash instead of hanging the suite.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from diagnose.run.jobenv import job_env
from diagnose.run.supervise import supervise
from probes.runner import kill_tree

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "hang"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]

pytest.importorskip("torch")


def line_of(script: Path, text: str) -> int:
    return next(no for no, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def marked(name: str, value: str) -> list[psutil.Process]:
    """Live processes whose environment has ``name=value``, wherever they ended up."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(name) == value and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def leftovers(out: Path) -> list[psutil.Process]:
    """Processes started under this run's hook directory that are still alive."""
    return marked("DIAGNOSE_HOOK_DIR", str((out / ".hook").resolve()))


def diagnose_run(out: Path, script: str, *options: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HANG_TIMEOUT_S="30", **env_vars)
    argv = [sys.executable, "-m", "diagnose", "run", "--hang-after", "3", "--grace", "2", "--out", str(out), *options]
    proc = subprocess.run(
        [*argv, "--", *TORCHRUN, str(FIXTURES / script)], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )
    assert not leftovers(out), "diagnose run left processes behind"
    return proc


def evidence_lines(report: dict, rule: str) -> list[str]:
    finding = next(f for f in report["findings"] if f["id"] == rule)
    return [line for item in finding["evidence"] if item["state"] == "fired" for line in item["lines"]]


def test_barrier_reached_by_rank_zero_only(tmp_path):
    proc = diagnose_run(tmp_path, "barrier_rank0.py", "--json")
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["summary"]["top"] == "sync.barrier-divergence"
    hang = report["facts"]["hang"]
    assert hang["outcome"] == "hung" and hang["idle_s"] >= 3
    ranks = sorted(hang["ranks"], key=lambda r: r["rank"])
    assert [(r["rank"], r["waiting_in"]) for r in ranks] == [(0, "barrier"), (1, "user_code")]
    assert all(r["method"] in ("py-spy", "faulthandler") for r in ranks)
    script = FIXTURES / "barrier_rank0.py"
    barrier_line = line_of(script, "dist.barrier()")
    assert ranks[0]["user_frame"] == {"file": str(script), "line": barrier_line, "function": "prepare_data"}
    assert f"rank 0: barrier at {script}:{barrier_line} in prepare_data" in evidence_lines(
        report, "sync.barrier-divergence"
    )
    assert f"rank 0: waits in barrier at {script}:{barrier_line} (in barrier)" in proc.stderr
    assert f"rank 1: busy in its own work at {script}:" in proc.stderr
    assert f"source: dist.barrier at {script}:{barrier_line} runs only under `if rank == 0:`" in proc.stderr
    # the Flight Recorder, turned on by diagnose run, saw rank 0 enter a barrier rank 1 never reached
    assert [(s["op"], s["entered"], s["missing"]) for s in hang["stragglers"]] == [("barrier", [0], [1])]
    # ... in a branch only rank 0 takes, read from the job's own source
    assert ranks[0]["rank_branch"] == "if rank == 0:" and hang["rank_zero_calls"] == [
        {"file": str(script), "line": barrier_line, "call": "dist.barrier", "condition": "if rank == 0:"}
    ]
    assert hang["sequence"] == "rank-behind"
    assert hang["last_output"] in ("rank 0: preparing data", "rank 1: data ready", "rank 1: training")  # not teardown
    # torchrun's reaction to the TERM that ended the job is not shown as the user's error
    assert "SignalException" not in proc.stderr
    # the log keeps the teardown (torchrun's reaction to TERM); the diagnosis reads up to the hang
    assert "SignalException" in (tmp_path / "output.log").read_text()
    assert not any("SignalException" in line["text"] for line in report["facts"]["log"]["lines"])
    assert json.loads((tmp_path / "report.json").read_text())["summary"]["top"] == "sync.barrier-divergence"


def test_uneven_batches_leave_one_rank_in_all_reduce(tmp_path):
    proc = diagnose_run(tmp_path, "uneven_batches.py", "--json")
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    # the Flight Recorder read as a sequence: the step's all_reduces repeated until rank 0 did one more
    assert report["summary"]["top"] == "sync.uneven-batches"
    assert report["facts"]["hang"]["sequence"] == "uneven-iterations"
    ranks = sorted(report["facts"]["hang"]["ranks"], key=lambda r: r["rank"])
    assert [(r["rank"], r["waiting_in"], r["activity"]) for r in ranks] == [
        (0, "all_reduce", "collective"),
        (1, "barrier", "collective"),
    ]
    assert [r["library_frame"]["function"] for r in ranks] == ["all_reduce", "barrier"]
    script = FIXTURES / "uneven_batches.py"
    assert f"rank 1: waits in barrier at {script}:{line_of(script, 'dist.barrier()')} (in barrier)" in proc.stderr
    assert (
        f"rank 0: waits in all_reduce at {script}:{line_of(script, 'dist.all_reduce(param.grad)')} (in all_reduce)"
        in proc.stderr
    )
    assert "until some ranks ran one more step (uneven batches)" in proc.stderr
    stragglers = report["facts"]["hang"]["stragglers"]
    assert [s["ops"] for s in stragglers] == [{"0": "all_reduce", "1": "barrier"}]


def test_a_detected_collective_mismatch_in_the_log_is_evidence(tmp_path):
    """With TORCH_DISTRIBUTED_DEBUG=DETAIL the same uneven job fails fast, and says why."""
    proc = diagnose_run(tmp_path, "uneven_batches.py", "--json", TORCH_DISTRIBUTED_DEBUG="DETAIL")
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["facts"]["hang"]["outcome"] == "crashed"
    assert report["summary"]["top"] == "sync.collective-mismatch"


def test_crash_on_rank_one_is_diagnosed_from_the_log(tmp_path):
    proc = diagnose_run(tmp_path, "raise_rank1.py", "--json")
    assert proc.returncode == 1, proc.stderr[-2000:]  # the job's own exit status
    report = json.loads(proc.stdout)
    hang = report["facts"]["hang"]
    assert (hang["outcome"], hang["exit_code"], hang["ranks"]) == ("crashed", 1, None)
    assert "the job failed (exit 1); first failing rank: 1" in proc.stderr
    assert report["summary"]["top"] == "hang.rank-failed-first"
    assert any(
        "rank 1" in line and "ValueError: shard 1 is empty" in line
        for line in evidence_lines(report, "hang.rank-failed-first")
    )
    script = FIXTURES / "raise_rank1.py"
    failure = hang["first_failure"]
    assert (failure["rank"], failure["exception"], failure["explained"]) == (1, "ValueError", False)
    assert failure["user_frame"] == {
        "file": str(script),
        "line": line_of(script, "raise ValueError"),
        "function": "load_shard",
    }


def test_a_job_that_finishes_passes_its_exit_code_through(tmp_path):
    proc = diagnose_run(tmp_path, "healthy.py")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rank 0: step 3/3 sum 5" in proc.stdout  # its output, passed through
    assert "lightning-diagnose" in proc.stdout  # then the report
    assert "diagnose run: the job finished (exit 0)" in proc.stderr
    facts = json.loads((tmp_path / "facts.json").read_text())
    assert (facts["hang"]["outcome"], facts["hang"]["exit_code"], facts["hang"]["detected"]) == ("finished", 0, False)


def test_without_ptrace_the_faulthandler_hook_takes_the_stacks(tmp_path):
    env, fr_dir = job_env(dict(os.environ, HANG_TIMEOUT_S="30"), tmp_path.resolve(), debug_env=True)
    sink = io.BytesIO()
    result = supervise(
        [*TORCHRUN, str(FIXTURES / "barrier_rank0.py")],
        out=tmp_path,
        hang_after=3,
        grace=2,
        env=env,
        fr_dir=fr_dir,
        py_spy=str(tmp_path / "no-py-spy"),
        stdout=sink,
        stderr=sink,
    )
    assert result.outcome == "hung"
    ranks = sorted(result.hang.ranks, key=lambda r: r.rank)
    assert [(r.rank, r.method, r.waiting_in) for r in ranks] == [
        (0, "faulthandler", "barrier"),
        (1, "faulthandler", "user_code"),
    ]
    assert "not found" in result.hang.unavailable["ranks.method"]
    assert b"rank 1: training" in sink.getvalue()
    assert not leftovers(tmp_path)


# --- without torch: the supervisor's own behaviour ---------------------------------------------


def test_keep_leaves_a_hung_job_running(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text("import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.2)\n")
    sink = io.BytesIO()
    result = supervise([sys.executable, str(script)], out=tmp_path, hang_after=1, keep=True, stdout=sink, stderr=sink)
    try:
        assert result.outcome == "hung"
        (stack,) = result.hang.ranks
        assert (stack.rank, stack.waiting_in, stack.user_frame.line) == (None, "user_code", 4)
        assert psutil.pid_exists(stack.pid) and psutil.Process(stack.pid).status() != psutil.STATUS_ZOMBIE
        assert result.kept_pid == stack.pid
    finally:
        kill_tree(stack.pid)


def test_a_busy_silent_job_outside_any_collective_is_not_hung(tmp_path):
    """Silent for three times --hang-after but computing: progress, not a hang."""
    script = tmp_path / "compute.py"
    script.write_text(
        "import time\nprint('computing', flush=True)\nend = time.time() + 3.5\nwhile time.time() < end:\n    pass\n"
    )
    sink = io.BytesIO()
    result = supervise([sys.executable, str(script)], out=tmp_path, hang_after=1, grace=1, stdout=sink, stderr=sink)
    assert (result.outcome, result.exit_code) == ("finished", 0)


def test_debug_env_keeps_what_the_user_set(tmp_path):
    env, fr_dir = job_env({"TORCH_NCCL_DESYNC_DEBUG": "0", "PYTHONPATH": "/mine"}, tmp_path, debug_env=True)
    assert env["TORCH_NCCL_DESYNC_DEBUG"] == "0"
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and fr_dir == tmp_path / "flight-recorder"
    assert env["TORCH_FR_DUMP_TEMP_FILE"].startswith(str(fr_dir))
    assert env["PYTHONPATH"].endswith(os.pathsep + "/mine")
    off, no_dir = job_env({}, tmp_path, debug_env=False)
    assert no_dir is None and not any(k.startswith("TORCH_") for k in off)
    disabled, none_dir = job_env({"TORCH_FR_BUFFER_SIZE": "0"}, tmp_path, debug_env=True)
    assert none_dir is None and disabled["TORCH_FR_BUFFER_SIZE"] == "0"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "python"], "give the command after `--`"),
        (["run", "--"], "no command after `--`"),
        (
            ["run", "--hang-after", "0", "--", "true"],
            "--hang-after must be a finite number of seconds, more than 0 (got 0)",
        ),
        (["run", "--hang-after", "nan", "--", "true"], "--hang-after must be a finite number of seconds"),
        (["run", "--hang-after", "inf", "--", "true"], "(got inf)"),
        (["run", "--grace", "nan", "--", "true"], "--grace must be a finite number of seconds, 0 or more (got nan)"),
        (["run", "--grace", "inf", "--", "true"], "--grace must be"),
        (["run", "--grace", "-1", "--", "true"], "--grace must be"),
        (["run", "--out", "{out}", "--", "/no/such/program"], "/no/such/program: cannot start"),
    ],
)
def test_usage_errors_are_one_line(tmp_path, args, message):
    argv = [a.replace("{out}", str(tmp_path)) for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "diagnose", *argv], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr
