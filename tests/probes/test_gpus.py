"""probes.gpus against NVML answers replayed from tests/fixtures/probes/nvml (see its README
for the public bug reports each machine is reconstructed from), and for real on this machine."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from probes import gpus
from probes.env import REDACTED
from probes.facts import Gpu, GpuProcess, Gpus

FIXTURES = Path(__file__).parents[1] / "fixtures" / "probes" / "nvml"

# nvmlReturn_t codes and the messages nvidia-ml-py gives them
_ERRORS = {
    "INVALID_ARGUMENT": (2, "Invalid Argument"),
    "NOT_SUPPORTED": (3, "Not Supported"),
    "NO_PERMISSION": (4, "Insufficient Permissions"),
    "DRIVER_NOT_LOADED": (9, "Driver Not Loaded"),
    "LIBRARY_NOT_FOUND": (12, "NVML Shared Library Not Found"),
    "GPU_IS_LOST": (15, "GPU is lost"),
}


class NVMLError(Exception):
    def __init__(self, name: str) -> None:
        self.value, message = _ERRORS[name]
        super().__init__(message)


class NVMLLibraryMismatchError(Exception):
    """What nvidia-ml-py raises for an unversioned call the driver's NVML does not have."""


class FakeNvml:
    """The slice of the pynvml module that probes.gpus calls, answering from a recording."""

    NVMLError = NVMLError
    NVMLLibraryMismatchError = NVMLLibraryMismatchError
    NVML_NVLINK_MAX_LINKS = 18
    locals().update({f"NVML_ERROR_{name}": code for name, (code, _) in _ERRORS.items()})

    def __init__(self, recording: dict[str, Any], init_error: str | None = None) -> None:
        self.rec = recording
        self.init_error = init_error
        self.initialised = False

    @classmethod
    def load(cls, name: str) -> FakeNvml:
        return cls(json.loads((FIXTURES / f"{name}.json").read_text()))

    def _answer(self, value: Any) -> Any:
        if isinstance(value, dict) and "nvml_error" in value:
            raise NVMLError(value["nvml_error"])
        return value

    def _device(self, handle: int) -> dict[str, Any]:
        assert self.initialised, "NVML called before nvmlInit"
        return self.rec["devices"][handle]

    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return self._answer(self.rec["driver_version"])

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self._answer(self.rec["cuda_driver_version"])

    def nvmlDeviceGetCount(self) -> int:
        return len(self.rec["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._device(index)
        return index

    def nvmlDeviceGetName(self, h: int) -> str:
        return self._answer(self._device(h)["name"])

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._answer(self._device(h)["uuid"])

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._answer(self._device(h)["pci_bus_id"]))

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        dev = self._device(h)
        return SimpleNamespace(total=dev["memory_total_mib"] * 2**20, used=dev["memory_used_mib"] * 2**20)

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return tuple(self._answer(self._device(h)["compute_capability"]))

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        return self._answer(self._device(h)["persistence_mode"])

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0), "uncorrected, volatile"
        return self._answer(self._device(h)["ecc_errors"])

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        return self._answer(self._device(h)["mig_mode"])

    def nvmlDeviceGetComputeMode(self, h: int) -> int:
        return self._answer(self._device(h)["compute_mode"])

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        running = self._device(h)["processes"]
        if running == {"nvml_error": "FUNCTION_NOT_FOUND"}:
            raise NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match")
        running = self._answer(running)
        return [
            SimpleNamespace(
                pid=p["pid"], usedGpuMemory=None if p["used_memory_mib"] is None else p["used_memory_mib"] * 2**20
            )
            for p in running
        ]

    def _links(self, h: int, link: int) -> str:
        links = self._answer(self._device(h)["nvlinks"])
        if link >= len(links):
            raise NVMLError("INVALID_ARGUMENT")
        return links[link]

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        self._links(h, link)
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._links(h, link))

    def _pair(self, a: int, b: int) -> dict[str, Any]:
        self._device(a)
        lo, hi = sorted((a, b))
        pairs = self.rec["pairs"]
        return pairs[f"{lo}-{hi}"] if f"{lo}-{hi}" in pairs else pairs["default"]

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return self._answer(self._pair(a, b)["common_ancestor"])

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        assert isinstance(index, int), "nvidia-ml-py's READ constant is a tuple; pass the int"
        return self._answer(self._pair(a, b)[{0: "p2p_read", 1: "p2p_write"}[index]])


def no_process(pid: int) -> None:
    return None


def test_two_rtx3090_on_an_nvlink_bridge() -> None:
    def read_proc(pid: int) -> tuple[list[str], dict[str, str]]:
        rank = str(pid - 4242)
        argv = ["python", "train.py", "--hf_token", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"]
        return argv, {"RANK": rank, "LOCAL_RANK": rank, "HF_TOKEN": "hf_secret"}

    found, driver = gpus.probe(FakeNvml.load("rtx3090-x2-nvlink-bridge"), environ={}, read_proc=read_proc)

    assert (driver.version, driver.cuda_version) == ("470.57.02", "11.4")
    assert found.count == 2 and found.consumer is True
    gpu0 = found.devices[0]
    assert gpu0.name == "NVIDIA GeForce RTX 3090"
    assert gpu0.pci_bus_id == "00000000:01:00.0"
    assert gpu0.compute_capability == "8.6"
    assert gpu0.memory_total_mib == 24268 and gpu0.memory_used_mib == 1200
    assert gpu0.persistence_mode is False and gpu0.compute_mode == "default"
    # GeForce: no ECC and no MIG; a reason each, not a value
    assert gpu0.ecc_errors is None and gpu0.mig_mode is None
    assert found.unavailable["devices.0.ecc_errors"] == "nvmlDeviceGetTotalEccErrors: Not Supported"
    assert found.unavailable["devices.1.mig_mode"] == "nvmlDeviceGetMigMode: Not Supported"
    assert [(p.pid, p.rank, p.local_rank, p.used_memory_mib) for p in gpu0.processes] == [
        (4242, 0, 0, 600),
        (4243, 1, 1, 600),
    ]
    assert gpu0.processes[0].cmdline == f"python train.py --hf_token {REDACTED}"
    assert found.processes_on_gpu0 == 2
    assert found.foreign_ranks_on_gpu0 == 1  # LOCAL_RANK 1 belongs on GPU 1
    [link] = found.topology
    assert (link.a, link.b, link.nvlinks, link.common_ancestor) == (0, 1, 4, "NVLINK")
    assert found.p2p_ok is True


def test_eight_rtx3090_without_p2p() -> None:
    found, driver = gpus.probe(FakeNvml.load("rtx3090-x8-pcie-no-p2p"), environ={}, read_proc=no_process)

    assert driver.cuda_version == "12.3"
    assert found.count == 8 and len(found.topology) == 28
    assert found.p2p_ok is False
    by_pair = {(link.a, link.b): link for link in found.topology}
    assert by_pair[(0, 3)].common_ancestor == "PXB"
    assert by_pair[(3, 4)].common_ancestor == "SYS"
    assert {link.p2p_read for link in found.topology} == {"gpu_not_supported"}
    assert all(link.nvlinks == 0 for link in found.topology)
    assert found.max_processes_per_gpu == 0


def test_dgx_a100_counts_nvlinks_through_the_nvswitches() -> None:
    found, driver = gpus.probe(FakeNvml.load("dgx-a100-40gb"), environ={}, read_proc=no_process)

    assert driver.version == "525.60.13"
    assert found.consumer is False and found.distinct_models == 1
    assert {d.compute_capability for d in found.devices} == {"8.0"}
    assert all(d.ecc_errors == 0 and d.mig_mode is False and d.persistence_mode for d in found.devices)
    # nvidia-smi topo -m shows NV12 between every pair of the 28
    assert [(link.nvlinks, link.common_ancestor) for link in found.topology] == [(12, "NVLINK")] * 28
    assert found.p2p_ok is True
    assert not any(key.startswith("devices.") for key in found.unavailable)


@pytest.mark.parametrize("name", ["rtx3090-x2-nvlink-bridge", "rtx3090-x8-pcie-no-p2p", "dgx-a100-40gb"])
def test_the_recorder_writes_what_the_fake_replays(name: str) -> None:
    """record.py, the script a GPU session runs, read through the fake: the same facts back."""
    spec = importlib.util.spec_from_file_location("nvml_record", FIXTURES / "record.py")
    recorder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recorder)

    original = FakeNvml.load(name)
    recording = json.loads(json.dumps(recorder.record(original, "replayed")))
    assert not original.initialised  # the recorder shut NVML down
    assert recording["devices"][0]["name"] == original.rec["devices"][0]["name"]
    assert gpus.probe(FakeNvml(recording), environ={}, read_proc=no_process) == gpus.probe(
        FakeNvml.load(name), environ={}, read_proc=no_process
    )


def test_a_lost_gpu_is_a_reason_and_the_other_fields_are_still_read() -> None:
    nvml = FakeNvml.load("dgx-a100-40gb")
    nvml.rec["devices"][3]["name"] = {"nvml_error": "GPU_IS_LOST"}
    nvml.rec["devices"][3]["processes"] = {"nvml_error": "NO_PERMISSION"}

    found, _ = gpus.probe(nvml, environ={}, read_proc=no_process)

    assert found.devices[3].name is None
    assert found.unavailable["devices.3.name"] == "nvmlDeviceGetName: GPU is lost"
    assert found.unavailable["devices.3.processes"] == "nvmlDeviceGetComputeRunningProcesses: Insufficient Permissions"
    assert found.devices[3].processes is None and found.devices[3].uuid is not None


def test_nvidia_ml_py_newer_than_the_driver() -> None:
    nvml = FakeNvml.load("rtx3090-x2-nvlink-bridge")
    nvml.rec["devices"][0]["processes"] = {"nvml_error": "FUNCTION_NOT_FOUND"}
    found, _ = gpus.probe(nvml, environ={}, read_proc=no_process)
    assert found.devices[0].processes is None
    assert found.unavailable["devices.0.processes"].startswith("nvmlDeviceGetComputeRunningProcesses: Unversioned")
    assert found.devices[1].processes is not None


@pytest.mark.parametrize(
    ("error", "message"),
    [("DRIVER_NOT_LOADED", "Driver Not Loaded"), ("LIBRARY_NOT_FOUND", "NVML Shared Library Not Found")],
)
def test_no_driver_is_a_reason_for_every_field(error: str, message: str, tmp_path) -> None:  # noqa: ANN001
    unreadable = tmp_path / "no-such-bus"
    found, driver = gpus.probe(
        FakeNvml({}, init_error=error), environ={"CUDA_VISIBLE_DEVICES": "0,0"}, pci_root=unreadable
    )

    reason = f"{gpus.NO_NVML}: {message}"
    assert found.unavailable == {"count": reason, "devices": reason, "topology": reason}
    assert driver.unavailable == {"version": reason, "cuda_version": reason}
    assert found.count is None and driver.version is None
    # the environment is still read
    assert found.visible == ["0", "0"] and found.visible_duplicates is True


def test_nvidia_ml_py_missing(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)
    found, _ = gpus.probe(environ={}, pci_root=tmp_path / "no-such-bus")
    assert found.unavailable["count"] == f"{gpus.NO_NVML}: nvidia-ml-py is not installed"


def _pci_device(root, name: str, vendor: str, klass: str) -> None:  # noqa: ANN001
    (root / name).mkdir(parents=True)
    (root / name / "vendor").write_text(vendor + "\n")
    (root / name / "class").write_text(klass + "\n")


def test_without_a_driver_the_pci_bus_still_counts_gpus(tmp_path) -> None:  # noqa: ANN001
    _pci_device(tmp_path, "0000:01:00.0", "0x10de", "0x030000")  # a GeForce: VGA controller
    _pci_device(tmp_path, "0000:01:00.1", "0x10de", "0x040300")  # its HDMI audio function
    _pci_device(tmp_path, "0000:41:00.0", "0x10de", "0x030200")  # a datacenter GPU: 3D controller
    _pci_device(tmp_path, "0000:00:02.0", "0x8086", "0x030000")  # an Intel iGPU
    found, driver = gpus.probe(FakeNvml({}, init_error="DRIVER_NOT_LOADED"), environ={}, pci_root=tmp_path)
    assert found.count == 2 and found.devices is None
    assert "count" not in found.unavailable and found.unavailable["devices"].startswith(gpus.NO_NVML)
    assert driver.version is None


def test_a_cpu_machine_has_zero_gpus_not_unknown(tmp_path) -> None:  # noqa: ANN001
    _pci_device(tmp_path, "0000:00:02.0", "0x8086", "0x030000")
    found, _ = gpus.probe(FakeNvml({}, init_error="LIBRARY_NOT_FOUND"), environ={}, pci_root=tmp_path)
    assert found.count == 0


def test_this_machine_for_real() -> None:
    """The real NVML path: on a GPU-less machine a reason, never an exception."""
    found, driver = gpus.probe()
    if found.devices is not None:
        assert driver.version and len(found.devices) == found.count
    else:
        assert found.unavailable["devices"].startswith(gpus.NO_NVML)
        assert driver.unavailable["version"] == found.unavailable["devices"]


@pytest.mark.parametrize(
    ("local_rank", "visible", "own"),
    [
        (1, None, 1),  # cuda:LOCAL_RANK of all GPUs
        (1, "4,5,6,7", 5),  # a job given GPUs 4-7
        (3, "3", 3),  # a launcher that gives each rank a list of one
        (2, "0,1", None),  # a LOCAL_RANK past the list: not a GPU of its own
        (0, "GPU-8d2f4c1e-aaaa-bbbb-cccc-0123456789ab", None),  # UUIDs are not indices
        (None, "0,1", None),
        (0, "", None),
    ],
)
def test_the_gpu_a_rank_should_drive(local_rank, visible, own) -> None:
    assert gpus.own_gpu(local_rank, visible) == own


def _on_gpu0(*owns: int | None) -> Gpus:
    processes = [GpuProcess(pid=100 + i, own_gpu=own) for i, own in enumerate(owns)]
    return Gpus(count=2, devices=[Gpu(index=0, processes=processes), Gpu(index=1, processes=[])])


def test_only_ranks_that_belong_elsewhere_count_as_foreign_on_gpu0() -> None:
    assert _on_gpu0(0, 1, 1).foreign_ranks_on_gpu0 == 2
    # rank 0 and two processes of other jobs (no LOCAL_RANK): none foreign
    assert _on_gpu0(0, None, None).foreign_ranks_on_gpu0 == 0
    assert _on_gpu0().foreign_ranks_on_gpu0 == 0
    # nothing on GPU 0 could be matched to a rank: unknown, not none
    assert _on_gpu0(None, None).foreign_ranks_on_gpu0 is None
    assert Gpus(count=1, devices=[Gpu(index=0)]).foreign_ranks_on_gpu0 is None
