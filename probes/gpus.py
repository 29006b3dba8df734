"""The ``gpus`` and ``driver`` sections, asked of NVML (nvidia-ml-py) in-process.

NVML answers in milliseconds without creating a CUDA context, where ``nvidia-smi`` takes
a second per call. Every call that can fail on some device (ECC on a GeForce, MIG before
Ampere) is asked on its own, so one unsupported field becomes a recorded reason and the
rest of the device is still read.

Devices are in NVML order (PCI bus order), which is CUDA's order only with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``; ``count`` is every device the driver sees, whatever
``CUDA_VISIBLE_DEVICES`` hides.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from itertools import combinations
from pathlib import Path
from typing import Any

import psutil

from probes.env import parse_visible_devices, redact_text
from probes.facts import Driver, Gpu, GpuLink, GpuProcess, Gpus

NO_NVML = "no NVIDIA driver/NVML"

# nvmlGpuP2PCapsIndex_t; nvidia-ml-py spells READ as the tuple ``(0,)``, so not from there
_P2P_READ, _P2P_WRITE = 0, 1

_ANCESTOR = {0: "INTERNAL", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_P2P_STATUS = {
    0: "ok",
    1: "chipset_not_supported",
    2: "gpu_not_supported",
    3: "ioh_topology_not_supported",
    4: "disabled_by_regkey",
    5: "not_supported",
    6: "unknown",
}
_COMPUTE_MODE = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}

# pid -> (command line, environment); None when the process cannot be read
ProcessReader = Callable[[int], tuple[list[str], Mapping[str, str]] | None]


def read_process(pid: int) -> tuple[list[str], Mapping[str, str]] | None:
    try:
        proc = psutil.Process(pid)
        cmdline = proc.cmdline()
    except psutil.Error:
        return None
    try:
        environ = proc.environ()
    except psutil.Error:  # another user's process: the command line is still worth having
        environ = {}
    return cmdline, environ


def probe(
    nvml: Any = None,
    *,
    environ: Mapping[str, str] | None = None,
    read_proc: ProcessReader = read_process,
    pci_root: Path | None = None,
) -> tuple[Gpus, Driver]:
    """``nvml`` is the ``pynvml`` module, or a stand-in replaying recorded answers.

    ``pci_root`` is where PCI devices are listed (default /sys/bus/pci/devices), read only
    when NVML cannot answer.
    """
    pci_root = PCI_DEVICES if pci_root is None else pci_root
    environ = os.environ if environ is None else environ
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return unanswered(f"{NO_NVML}: nvidia-ml-py is not installed", environ, pci_root)
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return unanswered(f"{NO_NVML}: {exc}", environ, pci_root)
    gpus, driver = _sections(environ)
    try:
        _read(nvml, gpus, driver, read_proc)
    finally:
        nvml.nvmlShutdown()
    return gpus, driver


PCI_DEVICES = Path("/sys/bus/pci/devices")
NVIDIA_VENDOR = "0x10de"


def unanswered(reason: str, environ: Mapping[str, str], pci_root: Path | None = PCI_DEVICES) -> tuple[Gpus, Driver]:
    """The sections when NVML gave nothing: every field carries ``reason``.

    The GPU count can still be known from the PCI bus: no NVIDIA display controller means
    none to drive (a CPU machine), and a count without a driver is a fact rules need.
    """
    gpus, driver = _sections(environ)
    for field in ("count", "devices", "topology"):
        gpus.unavailable[field] = reason
    for field in ("version", "cuda_version"):
        driver.unavailable[field] = reason
    on_bus = nvidia_pci_gpus(pci_root) if pci_root is not None else None
    if on_bus is not None:
        gpus.count = on_bus
        gpus.unavailable.pop("count")
    return gpus, driver


def nvidia_pci_gpus(root: Path) -> int | None:
    """NVIDIA display/3D controllers on the PCI bus (class 0x03xxxx); None when unreadable."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return None
    count = 0
    for entry in entries:
        try:
            vendor = (entry / "vendor").read_text().strip()
            klass = (entry / "class").read_text().strip()
        except OSError:
            continue
        count += vendor == NVIDIA_VENDOR and klass.startswith("0x03")
    return count


def _sections(environ: Mapping[str, str]) -> tuple[Gpus, Driver]:
    visible = parse_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"))
    return Gpus(source="live", visible=visible), Driver(source="live")


class _Asker:
    """Calls NVML, turning an NVMLError into a reason recorded under the field's name."""

    def __init__(self, nvml: Any, unavailable: dict[str, str]) -> None:
        self.nvml = nvml
        self.unavailable = unavailable
        # nvidia-ml-py newer than the driver raises this, not an NVMLError, for calls the
        # driver's NVML lacks (the v3 process list on a 470 driver)
        self.errors = (nvml.NVMLError, getattr(nvml, "NVMLLibraryMismatchError", nvml.NVMLError))

    def __call__(self, field: str, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.nvml, fn)(*args)
        except self.errors as exc:
            self.unavailable[field] = f"{fn}: {exc}"
            return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _read(nvml: Any, gpus: Gpus, driver: Driver, read_proc: ProcessReader) -> None:
    ask_driver = _Asker(nvml, driver.unavailable)
    driver.version = _text(ask_driver("version", "nvmlSystemGetDriverVersion"))
    cuda = ask_driver("cuda_version", "nvmlSystemGetCudaDriverVersion")
    if cuda is not None:  # 12020 -> 12.2
        driver.cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}"

    ask = _Asker(nvml, gpus.unavailable)
    count = ask("count", "nvmlDeviceGetCount")
    if count is None:
        gpus.unavailable["devices"] = gpus.unavailable["topology"] = gpus.unavailable["count"]
        return
    gpus.count = count
    handles: list[Any] = []
    devices: list[Gpu] = []
    for index in range(count):
        handle = ask(f"devices.{index}", "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            continue
        handles.append(handle)
        devices.append(_device(ask, index, handle, read_proc))
    gpus.devices = devices
    gpus.topology = _topology(nvml, ask, devices, handles)


def _device(ask: _Asker, index: int, handle: Any, read_proc: ProcessReader) -> Gpu:
    key = f"devices.{index}"
    gpu = Gpu(index=index)
    gpu.name = _text(ask(f"{key}.name", "nvmlDeviceGetName", handle))
    gpu.uuid = _text(ask(f"{key}.uuid", "nvmlDeviceGetUUID", handle))
    pci = ask(f"{key}.pci_bus_id", "nvmlDeviceGetPciInfo", handle)
    gpu.pci_bus_id = _text(pci.busId) if pci is not None else None
    memory = ask(f"{key}.memory_total_mib", "nvmlDeviceGetMemoryInfo", handle)
    if memory is None:
        ask.unavailable[f"{key}.memory_used_mib"] = ask.unavailable[f"{key}.memory_total_mib"]
    else:
        gpu.memory_total_mib = memory.total / 2**20
        gpu.memory_used_mib = memory.used / 2**20
    cc = ask(f"{key}.compute_capability", "nvmlDeviceGetCudaComputeCapability", handle)
    gpu.compute_capability = f"{cc[0]}.{cc[1]}" if cc is not None else None
    persistence = ask(f"{key}.persistence_mode", "nvmlDeviceGetPersistenceMode", handle)
    gpu.persistence_mode = None if persistence is None else persistence == 1
    # uncorrected errors since the driver loaded: the ones that crash a job now
    gpu.ecc_errors = ask(f"{key}.ecc_errors", "nvmlDeviceGetTotalEccErrors", handle, 1, 0)
    mig = ask(f"{key}.mig_mode", "nvmlDeviceGetMigMode", handle)
    gpu.mig_mode = None if mig is None else mig[0] == 1
    mode = ask(f"{key}.compute_mode", "nvmlDeviceGetComputeMode", handle)
    gpu.compute_mode = None if mode is None else _COMPUTE_MODE.get(mode, str(mode))
    running = ask(f"{key}.processes", "nvmlDeviceGetComputeRunningProcesses", handle)
    if running is not None:
        gpu.processes = [_process(p, read_proc) for p in running]
    return gpu


def _process(running: Any, read_proc: ProcessReader) -> GpuProcess:
    used = getattr(running, "usedGpuMemory", None)  # None where the driver hides it
    proc = GpuProcess(pid=running.pid, used_memory_mib=None if used is None else used / 2**20)
    # NVML reports host pids; inside a container without the host's pid namespace this
    # pid is not ours to read, and read_proc finds nothing
    seen = read_proc(running.pid)
    if seen is None:
        return proc
    cmdline, environ = seen
    proc.cmdline = redact_text(" ".join(cmdline)) or None
    proc.rank = _int(environ.get("RANK"))
    proc.local_rank = _int(environ.get("LOCAL_RANK"))
    proc.own_gpu = own_gpu(proc.local_rank, environ.get("CUDA_VISIBLE_DEVICES"))
    return proc


def own_gpu(local_rank: int | None, visible: str | None) -> int | None:
    """The NVML index of the GPU a rank should drive: cuda:LOCAL_RANK, read through the
    CUDA_VISIBLE_DEVICES of its own process (a launcher may give each rank a list of one)."""
    if local_rank is None:
        return None
    if visible is None:
        return local_rank
    ids = [_int(part.strip()) for part in visible.split(",") if part.strip()]
    if not ids or None in ids:  # UUIDs, MIG names or garbage: not an index
        return None
    if len(ids) == 1:
        return ids[0]
    return ids[local_rank] if local_rank < len(ids) else None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _topology(nvml: Any, ask: _Asker, devices: list[Gpu], handles: list[Any]) -> list[GpuLink]:
    nvlinks = _nvlink_pairs(nvml, devices, handles)
    links: list[GpuLink] = []
    for (a, ha), (b, hb) in combinations(zip(devices, handles, strict=True), 2):
        key = f"topology.{a.index}-{b.index}"
        link = GpuLink(a=a.index, b=b.index, nvlinks=nvlinks.get((a.index, b.index), 0))
        level = ask(f"{key}.common_ancestor", "nvmlDeviceGetTopologyCommonAncestor", ha, hb)
        if link.nvlinks:
            link.common_ancestor = "NVLINK"  # as nvidia-smi topo -m shows NV#
        elif level is not None:
            link.common_ancestor = _ANCESTOR.get(level, str(level))
        for field, index in (("p2p_read", _P2P_READ), ("p2p_write", _P2P_WRITE)):
            status = ask(f"{key}.{field}", "nvmlDeviceGetP2PStatus", ha, hb, index)
            if status is not None:
                setattr(link, field, _P2P_STATUS.get(status, str(status)))
        links.append(link)
    return links


def _nvlink_pairs(nvml: Any, devices: list[Gpu], handles: list[Any]) -> dict[tuple[int, int], int]:
    """Active NVLink links between each pair of devices, as ``nvidia-smi topo -m`` counts them.

    A link ends at another GPU (a bridge) or at an NVSwitch (HGX/DGX boards). Two GPUs
    on the switch fabric reach each other over all their switch links, so a pair counts
    its direct links plus the smaller of the two switch-link counts. A far end that is
    none of our GPUs counts as a switch: in a VM the switches are often invisible. A GPU
    without NVLink answers NotSupported on link 0; that is "no links", not a gap.
    """
    by_bus = {d.pci_bus_id.lower(): d.index for d in devices if d.pci_bus_id}
    direct: dict[tuple[int, int], int] = {}
    to_switch: dict[int, int] = {}
    for device, handle in zip(devices, handles, strict=True):
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != 1:
                    continue
                remote = _text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except nvml.NVMLError:
                break  # past this device's last link
            peer = by_bus.get((remote or "").lower())
            if peer is None:
                to_switch[device.index] = to_switch.get(device.index, 0) + 1
            elif peer > device.index:  # each link is seen from both ends; count it once
                direct[(device.index, peer)] = direct.get((device.index, peer), 0) + 1
    pairs = dict(direct)
    for a, b in combinations(sorted(to_switch), 2):
        pairs[(a, b)] = pairs.get((a, b), 0) + min(to_switch[a], to_switch[b])
    return pairs
