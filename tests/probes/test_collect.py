"""probes.collect: the whole live snapshot, for real on this GPU-less machine and with
stand-ins for NVML and the torch child."""

from __future__ import annotations

import importlib.util
import sys
import threading
import uuid
from datetime import datetime, timezone
from importlib import metadata

import pytest
from packaging.version import Version

from probes import collect, runner
from probes.snapshot import dump_snapshot, load_snapshot
from tests.probes.test_env import SECRETS
from tests.probes.test_gpus import FakeNvml
from tests.probes.test_runner import leftovers
from tests.probes.test_torch_build import CANNED, fake

_NEEDS = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="needs torch: the live probes of this machine"
)


TERMINAL = {"passed", "failed", "skipped"}


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str | None]] = []

    def __call__(self, step: str, state: str, detail: str | None) -> None:
        self.events.append((step, state, detail))

    def final(self) -> dict[str, tuple[str, str | None]]:
        return {step: (state, detail) for step, state, detail in self.events if state in TERMINAL}


@_NEEDS
def test_this_machine(tmp_path) -> None:  # noqa: ANN001
    progress = Recorder()
    facts = collect.collect(torch_timeout=60, progress=progress)

    assert facts.inputs == ["live"]
    assert datetime.fromisoformat(facts.created).tzinfo == timezone.utc
    for section in ("host", "packages", "env", "torch", "gpus", "driver", "launcher"):
        assert getattr(facts, section).source == "live", section
    # torch.__version__ carries the build's local label (+cu130, +cpu) that a wheel's metadata may lack
    assert Version(facts.torch.version).public == Version(metadata.version("torch")).public
    assert facts.torch.device_count is not None
    assert facts.packages.values["lightning"] == metadata.version("lightning") and facts.packages.complete
    assert facts.host.shm_total_bytes is not None
    assert facts.launcher.kind in {"none", "torchrun", "slurm", "mpirun", "deepspeed", "jupyter"}
    if facts.gpus.devices is None:  # no driver: a reason and a skipped entry, never an exception
        assert facts.gpus.unavailable["devices"].startswith("no NVIDIA driver/NVML")
        assert [s.what for s in facts.skipped] == ["gpus"]
    else:
        assert facts.driver.version and len(facts.gpus.devices) == facts.gpus.count
    assert facts.errors == []
    # every step announced, then settled once
    assert {step for step, state, _ in progress.events if state == "running"} == set(collect.STEPS)
    final = progress.final()
    assert set(final) == set(collect.STEPS)
    assert final["gpus"][0] == ("skipped" if facts.gpus.devices is None else "passed")
    assert final["torch"][0] == "passed" and final["torch"][1].startswith(f"{facts.torch.version} ")
    # and the snapshot reads back the same
    path = tmp_path / "snap.json"
    path.write_text(dump_snapshot(facts))
    assert load_snapshot(path) == facts


def test_secrets_never_reach_the_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    # and the same values hidden inside variables the allow-list keeps
    monkeypatch.setenv("NCCL_DEBUG_FILE", SECRETS["HF_TOKEN"])
    monkeypatch.setenv("TORCH_HOME", f"https://user:{SECRETS['MY_PASSWORD']}@example.com/hub")
    monkeypatch.setenv("CUDA_SOMETHING", SECRETS["AWS_SECRET_ACCESS_KEY"])
    monkeypatch.setenv("SLURM_JOB_TOKEN", SECRETS["WANDB_API_KEY"])
    facts = collect.collect(nvml=FakeNvml.load("rtx3090-x2-nvlink-bridge"), python=fake("crash"))

    snapshot = dump_snapshot(facts)
    for name, value in SECRETS.items():
        assert value not in snapshot
        assert name not in snapshot
    assert "example.com" not in snapshot
    assert facts.env.values["NCCL_DEBUG_FILE"] == "<redacted>"
    assert facts.env.values["SLURM_JOB_TOKEN"] == "<redacted>"


def test_a_probe_that_raises_is_an_error_and_the_rest_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**kwargs):  # noqa: ANN003, ANN202
        raise RuntimeError("cannot read /proc")

    monkeypatch.setattr(collect.host, "probe", broken)
    progress = Recorder()
    facts = collect.collect(environ={}, nvml=FakeNvml.load("dgx-a100-40gb"), python=fake("crash"), progress=progress)

    assert [(e.probe, e.message) for e in facts.errors] == [("host", "RuntimeError: cannot read /proc")]
    assert progress.final()["host"] == ("failed", "cannot read /proc")
    assert facts.host.source is None
    assert facts.gpus.count == 8 and facts.driver.version == "525.60.13"
    assert progress.final()["gpus"] == ("passed", "8 GPU(s), driver 525.60.13")


def test_a_hanging_torch_child_is_timed_out_and_killed() -> None:
    marker = f"diagnose-test-{uuid.uuid4()}"
    progress = Recorder()
    facts = collect.collect(torch_timeout=2, environ={}, python=fake("stall", marker), progress=progress)

    assert facts.torch.init_error == "torch CUDA init timed out after 2 s (killed)"
    state, detail = progress.final()["torch"]
    assert state == "failed" and detail.endswith("timed out after 2 s (killed)")
    assert leftovers(marker) == []


def test_the_torch_child_overlaps_the_other_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child is started before the in-process probes run, not after them."""
    host_ran = threading.Event()
    real_host = collect.host.probe

    def host_probe(**kwargs):  # noqa: ANN003, ANN202
        host_ran.set()
        return real_host(**kwargs)

    def run(argv, timeout):  # noqa: ANN001, ANN202
        # a sequential collect would call this before host.probe, and wait here in vain
        if not host_ran.wait(timeout=10):
            return runner.Result(tuple(argv), None, "", "", 10.0, error="started after the other probes")
        return runner.Result(tuple(argv), 0, CANNED, "", 0.1)

    monkeypatch.setattr(collect.host, "probe", host_probe)
    facts = collect.collect(environ={}, run=run, python=(sys.executable,))
    assert facts.torch.init_error is None and facts.torch.version == "2.1.2+cu118"


def test_a_torch_probe_that_raises_is_an_error() -> None:
    def run(argv, timeout):  # noqa: ANN001, ANN202
        raise OSError("too many open files")

    progress = Recorder()
    facts = collect.collect(environ={}, run=run, python=(sys.executable,), progress=progress)
    assert [(e.probe, e.message) for e in facts.errors] == [("torch", "OSError: too many open files")]
    assert progress.final()["torch"] == ("failed", "too many open files")


def test_a_hung_nvml_is_abandoned_at_its_deadline() -> None:
    release = threading.Event()
    nvml = FakeNvml.load("dgx-a100-40gb")
    nvml.nvmlInit = lambda: release.wait(30)  # a wedged driver: nvmlInit never returns
    progress = Recorder()
    try:
        facts = collect.collect(environ={}, nvml=nvml, nvml_timeout=0.5, python=fake("crash"), progress=progress)
    finally:
        release.set()

    reason = "NVML did not answer within 0.5 s: the driver may be hung"
    assert facts.gpus.unavailable["devices"] == reason and facts.driver.unavailable["version"] == reason
    state, detail = progress.final()["gpus"]
    assert state == "failed" and detail.endswith(reason)  # after this machine's PCI count
    assert facts.errors == [] and facts.host.source == "live"
