"""The CLI contract: stdout is the document, errors are one stderr line, exit codes mean something."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from diagnose.cli import main
from diagnose.contract import Exit
from diagnose.report import REPORT_SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "tests" / "fixtures" / "snapshots"


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "diagnose", *args], capture_output=True, text=True, input=stdin, timeout=120, cwd=ROOT
    )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("diagnose: error: ") and "Traceback" not in proc.stderr
    return lines[0]


def test_json_from_snapshot_exit_1_on_error_finding():
    proc = run("--json", "--from", str(SNAPSHOTS / "devices_duplicate-gpu.json"))
    assert proc.returncode == Exit.FINDINGS, proc.stderr
    report = json.loads(proc.stdout)
    assert report["schema_version"] == REPORT_SCHEMA_VERSION
    assert report["summary"]["top"] == "devices.duplicate-gpu"
    assert proc.stderr == ""


def test_json_exit_0_without_error_finding():
    proc = run("--format", "json", "--from", str(SNAPSHOTS / "healthy.json"))
    assert proc.returncode == Exit.OK, proc.stderr
    assert json.loads(proc.stdout)["summary"]["errors"] == 0


def test_report_validates_against_published_schema():
    schema = json.loads(run("schema").stdout)
    report = json.loads(run("--json", "--from", str(SNAPSHOTS / "sync_barrier-divergence.json")).stdout)
    jsonschema.validate(report, schema)


def test_published_schema_is_fresh():
    published = (ROOT / "docs" / "report.schema.json").read_text()
    assert run("schema").stdout == published, "report schema changed: run `diagnose schema > docs/report.schema.json`"


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"{not json", "invalid JSON"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "binary data"),
        (b'{"schema_version": 99}', "newer"),
    ],
)
def test_corrupt_snapshot_exit_2_one_line(tmp_path, content, needle):
    path = tmp_path / "facts.json"
    path.write_bytes(content)
    proc = run("--json", "--from", str(path))
    assert proc.returncode == Exit.USAGE and proc.stdout == ""
    line = one_error_line(proc)
    assert str(path) in line and needle in line


def test_binary_log_exit_2_one_line(tmp_path):
    path = tmp_path / "core.bin"
    path.write_bytes(bytes(range(256)) * 64)
    proc = run("--json", "--log", str(path))
    assert proc.returncode == Exit.USAGE and proc.stdout == ""
    assert str(path) in one_error_line(proc)


def test_binary_report_exit_2_one_line(tmp_path):
    path = tmp_path / "env.bin"
    path.write_bytes(b"\x00\x01\x02" * 100)
    proc = run("--json", "--report", str(path))
    assert proc.returncode == Exit.USAGE and f"{path}: not a text report: binary data" in one_error_line(proc)


def test_offline_report_and_log_rank_the_cause():
    report = "Collecting environment information...\nPyTorch version: 2.1.0+cu121\nIs CUDA available: True\nGPU models and configuration:\nGPU 0: NVIDIA GeForce RTX 4090\nGPU 1: NVIDIA GeForce RTX 4090\n"
    log = "[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, invalid usage\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000\n"
    import diagnose

    result = diagnose.diagnose_text(report=report, log=log)
    assert result.findings[0].id == "devices.duplicate-gpu"
    assert result.facts.gpus.count == 2 and result.facts.torch.version == "2.1.0+cu121"


def test_offline_log_from_stdin():
    log = "NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000\n"
    proc = run("--json", "--log", "-", stdin=log)
    report = json.loads(proc.stdout)
    assert report["summary"]["top"] == "devices.duplicate-gpu"
    assert "log:stdin" in report["facts"]["inputs"]


def test_bad_rule_folder_exit_2_with_file_and_line(tmp_path):
    bad = tmp_path / "area" / "bad.yaml"
    bad.parent.mkdir()
    bad.write_text("id: area.bad\ntitle: t\nseverity: error\nevidence:\n  - {fact: gpu.count, ge: 2}\n")
    proc = run("--json", "--from", str(SNAPSHOTS / "healthy.json"), "--kb", str(tmp_path))
    assert proc.returncode == Exit.USAGE
    assert f"{bad}:5: evidence[0].fact: unknown fact path 'gpu.count'" in one_error_line(proc)


def test_user_rule_folder_adds_rules(tmp_path):
    rule = tmp_path / "site" / "always.yaml"
    rule.parent.mkdir()
    rule.write_text(
        "id: site.always\ntitle: Site rule\nseverity: info\nevidence:\n  - {fact: host.platform, eq: linux}\n"
        "explain: x\nfix: [{title: t, snippet: s}]\nreferences: [https://example.org]\n"
        "examples: [{expect: match, facts: {host: {platform: linux}}}, {expect: no-match, facts: {host: {platform: win32}}}]\n"
    )
    proc = run("--json", "--from", str(SNAPSHOTS / "healthy.json"), "--kb", str(tmp_path))
    assert "site.always" in [f["id"] for f in json.loads(proc.stdout)["findings"]]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--format", "yaml"], "invalid choice"),
        (["--from", "/nonexistent.json"], "cannot read"),
        (["--log", "/nonexistent.log"], "/nonexistent.log: cannot read log: No such file"),
        (["--report", "/nonexistent.txt"], "/nonexistent.txt: cannot read report"),
        (["--json", "--format", "markdown"], "disagree"),
        (["--report", "x", "--microtests", "all"], "needs a live run"),
        (["kb", "show", "no.such-rule"], "no rule 'no.such-rule'"),
        (["kb"], "required"),
    ],
)
def test_bad_usage_exit_2_one_line(args, needle):
    proc = run(*args)
    assert proc.returncode == Exit.USAGE, proc.stderr
    assert needle in one_error_line(proc)


def test_internal_failure_exit_3_one_line(monkeypatch, capsys):
    import diagnose.engine

    def boom(facts, kb):
        raise RuntimeError("kaput")

    monkeypatch.setattr(diagnose.engine, "evaluate", boom)
    assert main(["--json", "--from", str(SNAPSHOTS / "healthy.json")]) == Exit.INTERNAL
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["diagnose: internal error: RuntimeError: kaput (set DIAGNOSE_DEBUG=1 for the traceback)"]


def test_text_and_markdown_views():
    text = run("--format", "text", "--from", str(SNAPSHOTS / "devices_duplicate-gpu.json")).stdout
    assert "1. Two or more ranks use the same GPU" in text
    assert all(len(line) <= 80 for line in text.splitlines()), max(text.splitlines(), key=len)
    md = run("--format", "markdown", "--from", str(SNAPSHOTS / "devices_duplicate-gpu.json")).stdout
    assert md.startswith("## lightning-diagnose") and "### 1. Two or more ranks use the same GPU" in md


def test_facts_to_file_and_back(tmp_path):
    out = tmp_path / "snap.json"
    proc = run("facts", "--from", str(SNAPSHOTS / "healthy.json"), "--out", str(out))
    assert proc.returncode == 0 and proc.stdout == ""
    assert json.loads(out.read_text())["gpus"]["count"] == 2


def test_kb_list_and_show():
    listing = run("kb", "list").stdout
    assert "devices.duplicate-gpu" in listing and "startup.staggered-init-hang" in listing
    assert run("kb", "show", "devices.duplicate-gpu").stdout.startswith("id: devices.duplicate-gpu")


def test_kb_new_writes_a_rule_that_loads_and_passes(tmp_path):
    from diagnose.kb import load_kb
    from diagnose.kbtest import run_all

    assert run("kb", "new", "area.my-cause", "--dir", str(tmp_path)).returncode == 0
    kb = load_kb([tmp_path], shipped=False)
    assert [r.id for r in kb.rules] == ["area.my-cause"]
    assert all(r.ok for r in run_all(kb, signatures=False))  # the catalog's own examples run elsewhere
    assert run("kb", "new", "area.my-cause", "--dir", str(tmp_path)).returncode == Exit.USAGE


LIGHT_CHECK = """
import sys
{body}
heavy = sorted(m for m in sys.modules if m.split('.')[0] in {{'torch', 'lightning', 'pytorch_lightning', 'textual', 'pynvml'}})
print(heavy)
"""


@pytest.mark.parametrize(
    "body",
    [
        "import diagnose",
        "from diagnose.cli import main\ntry:\n    main(['--json', '--from', {snap!r}])\nexcept SystemExit:\n    pass",
        "import diagnose\nr = diagnose.evaluate(diagnose.load_snapshot({snap!r}), diagnose.load_kb())\nassert r.findings",
    ],
    ids=["import", "cli-json-from", "library"],
)
def test_no_heavy_imports(body):
    snap = str(SNAPSHOTS / "devices_duplicate-gpu.json")
    code = LIGHT_CHECK.format(body=body.format(snap=snap))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout + proc.stderr


def test_kb_paths_lists_what_rules_can_name():
    from diagnose.paths import check_path

    listed = run("kb", "paths").stdout.splitlines()
    assert "gpus.count" in listed and "packages.<NAME>" in listed and "env.<NAME>" in listed
    for path in listed:
        check_path(path.replace("<NAME>", "torch"))
