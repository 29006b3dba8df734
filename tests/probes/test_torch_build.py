"""probes.torch_build: the real child on this machine's CPU torch, and stand-in interpreters
(tests/fixtures/probes/fake_python.py) that hang or crash in CUDA init like a broken driver."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import pytest

from probes import runner, torch_build
from tests.probes.test_runner import leftovers

FAKE = Path(__file__).parents[1] / "fixtures" / "probes" / "fake_python.py"


def fake(mode: str, marker: str = "-") -> tuple[str, ...]:
    return (sys.executable, str(FAKE), mode, marker)


def test_this_machines_build() -> None:
    """The child's answers against torch asked directly, in this process."""
    torch = pytest.importorskip("torch", reason="asks this environment's own torch")

    facts = torch_build.probe(timeout=60)
    assert (facts.version, facts.cuda, facts.hip) == (torch.__version__, torch.version.cuda, torch.version.hip)
    assert facts.cuda_build is bool(torch.version.cuda or torch.version.hip)
    assert (facts.cuda_available, facts.device_count) == (torch.cuda.is_available(), torch.cuda.device_count())
    assert ("gloo" in facts.backends) is torch.distributed.is_gloo_available()
    assert ("nccl" in facts.backends) is torch.distributed.is_nccl_available()
    if not facts.cuda_build:  # this project's own venv: the CPU wheel
        assert facts.nccl is None and facts.cudnn is None and facts.arch_list == []
    assert facts.init_error is None and facts.unavailable == {}


def test_a_hanging_cuda_init_times_out_keeps_the_build_and_leaves_nothing() -> None:
    marker = f"diagnose-test-{uuid.uuid4()}"
    start = time.monotonic()
    facts = torch_build.probe(timeout=2, python=fake("stall", marker))
    assert time.monotonic() - start < 10
    assert facts.init_error == "torch CUDA init timed out after 2 s (killed)"
    assert facts.unavailable["cuda_available"] == facts.init_error
    assert facts.cuda_available is None and facts.device_count is None
    # what the child said before it hung
    assert (facts.version, facts.cuda, facts.cudnn, facts.nccl) == ("2.4.0+cu121", "12.1", "9.1.0", "2.20.5")
    assert facts.cuda_build is True and facts.backends == ["nccl", "gloo", "mpi"]
    assert "sm_90" in facts.arch_list
    assert leftovers(marker) == []


def test_a_crash_in_cuda_init() -> None:
    facts = torch_build.probe(timeout=20, python=fake("crash"))
    assert facts.init_error == "torch CUDA init crashed: killed by SIGSEGV"
    assert facts.version == "2.4.0+cu121"


def test_a_torch_that_cannot_import() -> None:
    facts = torch_build.probe(timeout=20, python=fake("before"))
    reason = "torch importing torch failed: ImportError: libcudart.so.12: cannot open shared object file"
    assert facts.init_error == reason
    assert facts.version is None and facts.unavailable["version"] == reason


def test_a_driver_too_old_for_the_build_is_the_init_error() -> None:
    """The UserWarning torch gives from is_available(), as posted in
    https://github.com/weaviate/Verba/issues/72 (driver 470, CUDA 11.4, a newer torch)."""
    warning = (
        "CUDA initialization: The NVIDIA driver on your system is too old (found version 11040). "
        "Please update your GPU driver by downloading and installing a new version from the URL: "
        "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to install a "
        "PyTorch version that has been compiled with your version of the CUDA driver. "
        "(Triggered internally at ../c10/cuda/CUDAFunctions.cpp:108.)"
    )
    stdout = (
        CANNED.split("\n")[0]
        + "\n"
        + torch_build.MARK
        + json.dumps({"stage": "cuda", "cuda_available": False, "device_count": 0, "warning": warning})
    )

    def run(argv, timeout):  # noqa: ANN001, ANN202 - the Runner protocol
        return runner.Result(tuple(argv), 0, stdout, "", 0.1)

    facts = torch_build.probe(run, 5, python=("python",))
    assert facts.cuda_available is False and facts.init_error == warning
    assert facts.version == "2.1.2+cu118"


# torch/version.py as a CUDA wheel ships it (2.1.2+cu118), read as text, never imported
VERSION_PY = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']
__version__ = '2.1.2+cu118'
debug = False
cuda: Optional[str] = '11.8'
git_version = 'a8e7c98cb95ff97bb30a728c6b2a1ce6bff946eb'
hip: Optional[str] = None
"""


def test_version_py_still_names_the_build_when_the_import_fails(tmp_path: Path) -> None:
    def run(argv, timeout):  # noqa: ANN001, ANN202 - the Runner protocol
        return runner.Result(tuple(argv), 1, "", "ImportError: numpy.core.multiarray failed to import\n", 0.5)

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "version.py").write_text(VERSION_PY)
    facts = torch_build.probe(run, 5, find=lambda: [str(tmp_path / "no-such-folder"), str(tmp_path / "torch")])
    assert (facts.version, facts.cuda, facts.cuda_build) == ("2.1.2+cu118", "11.8", True)
    assert facts.init_error == "torch importing torch failed: ImportError: numpy.core.multiarray failed to import"
    assert "version" not in facts.unavailable and "cuda" not in facts.unavailable
    assert facts.cuda_available is None and facts.device_count is None
    assert facts.unavailable["backends"] == facts.init_error


def test_no_torch_here_is_said_as_such() -> None:
    def run(argv, timeout):  # noqa: ANN001, ANN202 - the Runner protocol
        return runner.Result(tuple(argv), 1, "", "ModuleNotFoundError: No module named 'torch'\n", 0.05)

    facts = torch_build.probe(run, 5, find=lambda: None)
    assert facts.version is None and facts.init_error is None
    assert facts.unavailable == {"version": "torch is not installed in this environment"}


def test_the_childs_build_comes_before_any_discovery() -> None:
    """A child that reports its build is believed, whatever this interpreter has installed."""

    def run(argv, timeout):  # noqa: ANN001, ANN202 - the Runner protocol
        return runner.Result(tuple(argv), 0, CANNED, "", 0.1)

    def find():  # noqa: ANN202
        raise AssertionError("asked where torch lies although the child reported its build")

    assert torch_build.probe(run, 5, find=find).version == "2.1.2+cu118"


def test_another_interpreters_failure_is_not_read_as_no_torch_here() -> None:
    """Where this interpreter's torch lies says nothing of another's: its own failure is the answer."""
    facts = torch_build.probe(timeout=20, python=fake("before"), find=lambda: None)
    assert (
        facts.init_error == "torch importing torch failed: ImportError: libcudart.so.12: cannot open shared object file"
    )
    assert facts.unavailable["version"] == facts.init_error


def test_the_child_cannot_start() -> None:
    facts = torch_build.probe(python=("/no/such/python",))
    assert facts.init_error == "could not start the torch child: not found: /no/such/python"


# a CUDA build's two stages, then a third line cut short by a kill; cuDNN in its old
# numbering (8902 is 8.9.2)
CANNED = (
    torch_build.MARK + '{"stage": "build", "version": "2.1.2+cu118", "cuda": "11.8", "hip": null, "cudnn": 8902,'
    ' "nccl": [2, 18, 1], "arch_list": ["sm_86"], "backends": ["nccl", "gloo"]}\n'
    + torch_build.MARK
    + '{"stage": "cuda", "cuda_available": true, "device_count": 4}\n'
    + torch_build.MARK
    + '{"stage": "cu'
)


def test_canned_runner_output() -> None:
    def run(argv, timeout):  # noqa: ANN001, ANN202 - the Runner protocol
        assert argv[1] == "-c" and timeout == 5
        return runner.Result(tuple(argv), 0, CANNED, "", 0.1)

    facts = torch_build.probe(run, 5)
    assert (facts.cudnn, facts.nccl, facts.device_count, facts.cuda_available) == ("8.9.2", "2.18.1", 4, True)
    assert facts.cuda_build is True and facts.arch_list == ["sm_86"]
    assert facts.init_error is None and facts.unavailable == {}
