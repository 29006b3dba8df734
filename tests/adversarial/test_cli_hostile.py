"""The issue's reproductions against the real command line: exit 0/1 with a correct report,
or exit 2 with one line naming the file, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.adversarial.secrets import ALL_SECRETS, ENV_VALUES, PLANTED, PRIVATE_KEY_LINES

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "tests" / "fixtures" / "snapshots"
LOG = ROOT / "tests" / "fixtures" / "logs" / "cuda_oom_formats.log"


def run(
    *args: str, stdin: bytes | None = None, env: dict | None = None, shell: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    argv = ["bash", "-c", shell] if shell else [sys.executable, "-m", "diagnose", *args]
    return subprocess.run(
        argv, capture_output=True, input=stdin, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})}
    )


def one_line(proc: subprocess.CompletedProcess) -> str:
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("diagnose: error: ") and "Traceback" not in err, err
    return lines[0]


# --- secrets --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("secrets")
    log = folder / "train.log"
    lines = [line for line, _ in PLANTED] + PRIVATE_KEY_LINES
    # a matched error line quoted as an excerpt, with a token on it
    lines += [
        "torch.OutOfMemoryError: CUDA out of memory. Authorization: Bearer excerptBearer77 Tried to allocate 2.00 GiB"
    ]
    lines += [f"{name}={value}" for name, value, _ in ENV_VALUES]
    lines += [
        "torchrun --nproc_per_node 2 --master_addr http://admin:MasterPw55@node01 train.py --password Hunter2Hunter"
    ]
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = folder / "env.txt"
    report.write_text(
        "PyTorch version: 2.1.0+cu121\nIs debug build: False\nCUDA used to build PyTorch: 12.1\n"
        + "".join(f"{name}={value}\n" for name, value, _ in ENV_VALUES),
        encoding="utf-8",
    )
    return log, report


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_no_planted_secret_in_any_format(hostile_inputs: tuple[Path, Path], fmt: str) -> None:
    log, report = hostile_inputs
    proc = run("--format", fmt, "--log", str(log), "--report", str(report))
    assert proc.returncode in (0, 1), proc.stderr.decode()
    out = proc.stdout.decode()
    assert "<redacted>" in out
    leaked = [secret for secret in ALL_SECRETS + ["excerptBearer77"] if secret in out]
    assert leaked == []
    if fmt == "json":
        json.loads(out)


def test_no_planted_secret_in_a_saved_snapshot(hostile_inputs: tuple[Path, Path], tmp_path: Path) -> None:
    log, report = hostile_inputs
    out = tmp_path / "facts.json"
    proc = run("facts", "--log", str(log), "--report", str(report), "--out", str(out))
    assert proc.returncode == 0, proc.stderr.decode()
    saved = out.read_text(encoding="utf-8")
    assert [secret for secret in ALL_SECRETS if secret in saved] == []
    # and it loads back
    assert run("--from", str(out), "--json").returncode in (0, 1)


# --- safe output ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_terminal_escapes_from_a_log_never_reach_the_terminal(tmp_path: Path, fmt: str) -> None:
    log = tmp_path / "evil.log"
    log.write_bytes(
        b"\x1b]0;pwned-title\x07RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\x1b]52;c;ZXZpbA==\x07\n"
        b"\x1b[2J\x1b[31mtorch.distributed.DistBackendError: NCCL error\x9b\r\n"
    )
    proc = run("--format", fmt, "--log", str(log))
    assert proc.returncode in (0, 1), proc.stderr.decode()
    out = proc.stdout.decode()
    assert "CUDA out of memory" in out
    assert not any(c in out for c in "\x1b\x07\x9b\r")


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_a_non_utf8_stdout_gets_the_report_not_a_crash(fmt: str) -> None:
    proc = run(
        "--format", fmt, "--from", str(SNAPSHOTS / "devices_duplicate-gpu.json"), env={"PYTHONIOENCODING": "cp1252"}
    )
    assert proc.returncode == 1, proc.stderr.decode()
    assert b"Two or more ranks use the same GPU" in proc.stdout


def test_a_broken_pipe_keeps_the_exit_code() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "diagnose", "--format", "text", "--from", str(SNAPSHOTS / "devices_duplicate-gpu.json")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    proc.stdout.close()  # the reader is gone before the first write
    assert proc.wait(timeout=120) == 1
    assert b"Traceback" not in proc.stderr.read()


# --- inputs ---------------------------------------------------------------------------------------


def test_log_from_dev_stdin_and_process_substitution() -> None:
    text = LOG.read_bytes()
    via_stdin = run("--json", "--log", "/dev/stdin", stdin=text)
    via_dash = run("--json", "--log", "-", stdin=text)
    via_subst = run(shell=f"{sys.executable} -m diagnose --json --log <(cat {LOG})")
    ids = [[f["id"] for f in json.loads(p.stdout)["findings"]] for p in (via_stdin, via_dash, via_subst)]
    assert ids[0] and ids[0] == ids[1] == ids[2]


def test_report_from_a_pipe_and_in_utf16(tmp_path: Path) -> None:
    text = "PyTorch version: 2.1.0+cu121\nCUDA used to build PyTorch: 12.1\n"
    utf16 = tmp_path / "env-utf16.txt"
    utf16.write_bytes(text.encode("utf-16"))
    for proc in (run("facts", "--report", str(utf16)), run("facts", "--report", "-", stdin=text.encode())):
        assert proc.returncode == 0, proc.stderr.decode()
        assert json.loads(proc.stdout)["torch"]["version"] == "2.1.0+cu121"


def test_report_from_dev_zero_is_cut_off() -> None:
    assert "/dev/zero: more than 4 MiB" in one_line(run("--report", "/dev/zero"))


def test_a_huge_report_is_refused_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    with big.open("wb") as f:
        f.truncate(1 << 30)  # sparse: a 1 GB file that costs nothing
    assert f"{big}: too large (1024 MiB; at most 4 MiB) (a report; give a log with --log)" in one_line(
        run("--report", str(big))
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--nproc", "0"], "--nproc: must be at least 1"),
        (["--timeout", "inf"], "--timeout: must be a finite number"),
        (["--timeout", "nan"], "--timeout: must be a finite number"),
        (["--timeout", "-1"], "--timeout: must be a finite number"),
        (["--log", "/"], "/: cannot read log: is a directory"),
        (["--from", "/dev/zero"], "/dev/zero: more than"),
        (["kb", "docs", "--out", "/proc/version/rules.md"], "/proc/version/rules.md: Not a directory"),
    ],
)
def test_bad_input_is_one_line(args: list[str], needle: str) -> None:
    assert needle in one_line(run(*args))


def test_a_ten_megabyte_hostile_log_is_diagnosed(tmp_path: Path) -> None:
    """The issue's quadratic inputs, 10 MB of them: a report comes back (bounded by design)."""
    log = tmp_path / "hostile.log"
    line = "CUDA out of memory. " + "7" * 4060 + "\n"
    body = line * 1200 + ("mpirun " * 20_000 + "\n") * 10 + ("x" * 80_000 + "\n") * 10
    log.write_text(body[: 10 << 20], encoding="utf-8")
    # generous for a shared machine: the work is bounded by design, not by this limit
    proc = run("--json", "--log", str(log), timeout=60)
    assert proc.returncode in (0, 1), proc.stderr.decode()
    assert json.loads(proc.stdout)["findings"]


def test_mpirun_repeated_in_a_pasted_report(tmp_path: Path) -> None:
    """Quadratic in the old launcher search (1 MB did not finish in 120 s); linear now."""
    report = tmp_path / "env.txt"
    report.write_text("PyTorch version: 2.1.0\n" + "mpirun " * 150_000 + "-np 4\n", encoding="utf-8")
    proc = run("facts", "--report", str(report), timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout)["launcher"]["world_size"] == 4
