"""The Facts model: everything a diagnosis stands on, typed and serialisable.

A *snapshot* is ``Facts.model_dump_json()`` (``probes.snapshot`` reads and writes one). Every
value defaults to ``None``, which means "not known" (never "false"): a rule over an
unknown fact is reported as not checked. Each section records where it came from and,
per field, why something could not be probed.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_serializer, model_validator

from probes import clusterfacts
from probes.patterns import compile as _linear  # log lines are untrusted: linear-time matching

SCHEMA_VERSION = 1

Source = Literal["live", "snapshot", "report", "log", "microtest", "hang"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Section(_Model):
    source: Source | None = None
    # field name -> why it could not be probed ("nvml: driver not loaded")
    unavailable: dict[str, str] = Field(default_factory=dict)


class KeyedSection(Section):
    """A section whose facts are a name -> value mapping (``packages.torch``, ``env.RANK``).

    With ``complete`` true (a live enumeration) a name that is absent is known to be
    absent; otherwise (a pasted report) it is unknown.
    """

    keyed: ClassVar[bool] = True
    values: dict[str, str] = Field(default_factory=dict)
    complete: bool = False

    def normalise(self, key: str) -> str:
        return key

    def lookup(self, key: str) -> tuple[bool, str | None]:
        """(known, value): value None with known True means "known to be absent"."""
        key = self.normalise(key)
        if key in self.values:
            return True, self.values[key]
        return self.complete, None


# --- host -------------------------------------------------------------------------------


class Host(Section):
    platform: str | None = None  # sys.platform: linux, win32, darwin
    os: str | None = None
    kernel: str | None = None
    python: str | None = None
    cpu_count: int | None = None
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    shm_total_bytes: int | None = None
    shm_free_bytes: int | None = None
    container: str | None = None  # docker, podman, kubernetes, lxc, none
    memlock_limit_bytes: int | None = None  # -1 when unlimited
    interactive: bool | None = None  # running inside Jupyter/IPython/Colab


# --- packages and environment -------------------------------------------------------------


class _Owner:
    """The Facts a section belongs to, for derived facts that weigh two sections. It takes no
    part in equality (two equal snapshots have different owners), and a copy shares it."""

    __slots__ = ("facts", "memo")

    def __init__(self) -> None:
        self.facts: Any = None
        # derived values several facts share, with the inputs they were computed from
        self.memo: dict[str, Any] = {}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Owner)

    __hash__ = None  # type: ignore[assignment]

    def __copy__(self) -> _Owner:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _Owner:
        return self


def canonical_package(name: str) -> str:
    """PEP 503 normalisation, so ``PyTorch_Lightning`` and ``pytorch-lightning`` agree."""
    return re.sub(r"[-_.]+", "-", name).lower()


class Packages(KeyedSection):
    # what a library release needs of torch (kb/tables/packages.yaml), tested against the torch
    # installed beside it
    derived: ClassVar[tuple[str, ...]] = (
        "torch_requirements_unmet",
        "lightning_supports_torch",
        "accelerate_supports_torch",
        "transformers_supports_torch",
        "deepspeed_supports_torch",
    )
    _owner: _Owner = PrivateAttr(default_factory=_Owner)

    def normalise(self, key: str) -> str:
        return canonical_package(key)

    def lookup(self, key: str) -> tuple[bool, Any]:
        # a derived name is a fact about the packages, never a package called that
        if key in self.derived:
            value = getattr(self, key)
            return value is not None, value
        return super().lookup(key)

    def _torch_version(self) -> str | None:
        torch = self.values.get("torch")
        return torch or (self._owner.facts.torch.version if self._owner.facts is not None else None)

    def _unmet(self, package: str) -> str | None:
        """Why the installed torch falls outside what ``package`` needs ("lightning 2.5.1 needs torch>=2.1"); else None."""
        from probes.tables import shipped, version

        installed, torch = self.values.get(package), version(self._torch_version())
        needed = shipped().torch_requirement(package, installed)
        if needed is None or torch is None or needed.contains(torch, prereleases=True):
            return None
        return f"{package} {installed} needs torch{needed}"

    def _supports(self, *packages: str) -> bool | None:
        from probes.tables import shipped, version

        torch = version(self._torch_version())
        rows = [(p, self.values[p]) for p in packages if p in self.values]
        covered = [p for p, v in rows if shipped().torch_requirement(p, v) is not None]
        if torch is None or not covered:
            return None
        return not any(self._unmet(p) for p in covered)

    @property
    def torch_requirements_unmet(self) -> list[str] | None:
        if self._torch_version() is None:
            return None
        from probes.tables import shipped

        names = sorted(shipped().packages.requirements)
        return [u for u in (self._unmet(p) for p in [*names, "pytorch-lightning"]) if u]

    @property
    def lightning_supports_torch(self) -> bool | None:
        return self._supports("lightning", "pytorch-lightning")

    @property
    def accelerate_supports_torch(self) -> bool | None:
        return self._supports("accelerate")

    @property
    def transformers_supports_torch(self) -> bool | None:
        return self._supports("transformers")

    @property
    def deepspeed_supports_torch(self) -> bool | None:
        return self._supports("deepspeed")


class Env(KeyedSection):
    """Allow-listed environment variables, credentials redacted."""


# --- torch build --------------------------------------------------------------------------


class TorchBuild(Section):
    version: str | None = None
    cuda: str | None = None  # CUDA runtime torch was built with; None on a CPU build
    cudnn: str | None = None
    nccl: str | None = None
    hip: str | None = None
    cuda_build: bool | None = None
    cuda_available: bool | None = None
    device_count: int | None = None
    arch_list: list[str] | None = None  # e.g. ["sm_80", "sm_90"]
    backends: list[str] | None = None  # distributed backends available: nccl, gloo, mpi
    init_error: str | None = None  # what torch.cuda init said, or that it timed out
    # read with kb/tables/: what this build bundles and whether it runs on the job's GPUs
    derived: ClassVar[tuple[str, ...]] = (
        "bundled_nccl",
        "supports_gpu_arch",
        "nccl_supports_gpu_arch",
        "nccl_predates_gpu_arch",
        "nccl_known_issue",
        "missing_features",
    )
    _owner: _Owner = PrivateAttr(default_factory=_Owner)

    def _capabilities(self) -> list[Any]:
        gpus = self._owner.facts.gpus if self._owner.facts is not None else None
        return gpus.table_capabilities() if gpus is not None else []

    @property
    def bundled_nccl(self) -> str | None:
        """The NCCL the wheels of this torch release bundle (kb/tables/torch.yaml)."""
        from probes.tables import shipped

        row = shipped().torch_release(self.version)
        return row.nccl if row else None

    def _nccl(self) -> str | None:
        """The NCCL in use: as probed or bannered, else as the report names it, else bundled."""
        if self.nccl:
            return self.nccl
        signatures = self._owner.facts.log.signatures if self._owner.facts is not None else None
        named = [s.data["version"] for s in signatures or [] if s.id == "nccl_release_mentioned"]
        return named[0] if named else self.bundled_nccl

    def _cuda(self) -> str | None:
        """torch's CUDA runtime; without it, the CUDA the log's NCCL banner was built for
        ("NCCL version 2.21.5+cuda12.4"), the same runtime in a torch wheel."""
        if self.cuda or self._owner.facts is None:
            return self.cuda
        for sig in self._owner.facts.log.signatures or []:
            built = sig.data.get("version", "").partition("+cuda")[2] if sig.id == "nccl_version" else ""
            if built:
                return built
        return None

    @property
    def missing_features(self) -> list[str] | None:
        """Distributed APIs of newer torch releases this one lacks (fsdp, fully_shard...)."""
        from probes.tables import shipped

        missing = shipped().torch_missing(self.version)
        return None if missing is None else [f.feature for f in missing]

    @property
    def supports_gpu_arch(self) -> bool | None:
        """Whether this build has kernels for every GPU of the job: from its arch list when
        known, else from the oldest CUDA and torch each GPU's capability needs."""
        from probes.tables import release, version

        caps = self._capabilities()
        if not caps or (self._cuda() is None and not self.arch_list):
            return None
        if self.arch_list:
            return all(_arch_list_covers(self.arch_list, c.capability) for c in caps)
        cuda, torch = release(self._cuda()), version(self.version)
        if cuda is None:
            return None
        for c in caps:
            newest = min((release(v) for v in (c.last_cuda, c.torch_last_cuda) if v), default=None)
            if cuda < release(c.min_cuda) or (newest is not None and cuda > newest):
                return False
            if c.min_torch and torch is not None and torch < version(c.min_torch):
                return False
        return True

    def _nccl_cuda(self) -> str | None:
        """The CUDA the NCCL in use was built for, where the log says ("2.26.2+cuda12.2")."""
        signatures = self._owner.facts.log.signatures if self._owner.facts is not None else None
        for sig in signatures or []:
            if sig.id in ("nccl_version", "nccl_release_mentioned"):
                built = (sig.data.get("version") or "").partition("+cuda")[2] or sig.data.get("cuda")
                if built:
                    return built
        return None

    @property
    def nccl_supports_gpu_arch(self) -> bool | None:
        """Whether the NCCL this build uses is recent enough for every GPU of the job: a release
        that knows them, built for a CUDA that has their kernels (an NCCL built for CUDA 12.2
        has none for Blackwell, whatever its release)."""
        from probes.tables import release

        caps = self._capabilities()
        built = release(self._nccl_cuda())
        if built is not None and caps and any(built < release(c.min_cuda) for c in caps):
            return False
        return self._nccl_release_knows_gpus()

    @property
    def nccl_predates_gpu_arch(self) -> bool | None:
        """Whether the NCCL release itself is older than one its GPUs need (min_nccl), whatever
        CUDA it was built for: then NCCL, not torch's kernels, is what the GPUs outgrew."""
        knows = self._nccl_release_knows_gpus()
        return None if knows is None else not knows

    def _nccl_release_knows_gpus(self) -> bool | None:
        """Whether the NCCL release is at least the min_nccl of every GPU of the job."""
        from probes.tables import version

        caps, nccl = self._capabilities(), version(self._nccl())
        if nccl is None or not caps:
            return None
        return all(nccl >= version(c.min_nccl) for c in caps if c.min_nccl)

    @property
    def nccl_known_issue(self) -> str | None:
        """A defect of this NCCL release that a later one fixed (kb/tables/nccl.yaml), if any."""
        from probes.tables import shipped

        gpus = self._owner.facts.gpus if self._owner.facts is not None else None
        archs = gpus.arch if gpus is not None else None
        issues = shipped().nccl_issues(self._nccl(), tuple(archs) if archs else None)
        if not issues:
            return None
        i = issues[0]
        return f"NCCL {self._nccl()}: {i.issue}; fixed in {i.fixed_in}, workaround {i.workaround}"


def _arch_list_covers(arch_list: list[str], capability: str) -> bool:
    """A GPU of ``capability`` (major.minor) runs kernels built for sm_<major><m> with m <= minor
    (binary compatibility within a major version) and PTX for compute_<c> with c <= capability."""
    major, _, minor = capability.partition(".")
    for entry in arch_list:
        kind, _, number = entry.partition("_")
        if not number.isdigit() or len(number) < 2:
            continue
        e_major, e_minor = int(number[:-1]), int(number[-1])
        if kind == "sm" and e_major == int(major) and e_minor <= int(minor or 0):
            return True
        if kind == "compute" and (e_major, e_minor) <= (int(major), int(minor or 0)):
            return True
    return False


# --- GPUs -----------------------------------------------------------------------------------


class GpuProcess(_Model):
    pid: int
    used_memory_mib: float | None = None
    cmdline: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    # the GPU (NVML index) this rank should drive: its LOCAL_RANK read through its own
    # CUDA_VISIBLE_DEVICES; None where either is unknown or the list names GPUs by UUID
    own_gpu: int | None = None


class Gpu(_Model):
    index: int
    node: str | None = None  # where a report lists several nodes' GPUs: the task label it came under
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    compute_capability: str | None = None  # "8.6"
    persistence_mode: bool | None = None
    ecc_errors: int | None = None
    mig_mode: bool | None = None
    compute_mode: str | None = None
    processes: list[GpuProcess] | None = None


class GpuLink(_Model):
    a: int
    b: int
    common_ancestor: str | None = None  # NVLINK, PIX, PXB, PHB, NODE, SYS
    p2p_read: str | None = None  # ok, not_supported, disabled, ...
    p2p_write: str | None = None
    nvlinks: int | None = None


# NVML names every consumer card "... GeForce ..." or "... TITAN ..."; workstation cards such
# as "RTX 6000 Ada" or "RTX A6000" have no such word. For a model kb/tables/gpus.yaml lacks.
_CONSUMER_GPU = re.compile(r"GeForce|TITAN", re.IGNORECASE)
# a log line names a GPU only in a sentence about GPUs; "L4" or "T4" elsewhere is something else
# "卡" is a card in 多卡, 单卡, 显卡, 一张卡
# "xlarge": a cloud instance type (p3.8xlarge) names its GPU model (kb/tables/gpus.yaml)
_GPU_WORDS = ("gpu", "nvidia", "geforce", "tesla", "rtx", "gtx", "cuda", "card", "卡", "xlarge")


def _models_in_lines(lines: list[Any]) -> tuple[tuple[str, None], ...]:
    from probes.tables import shipped

    about_gpus = [line.text for line in lines if any(w in line.text.lower() for w in _GPU_WORDS)]
    names = [name for text in about_gpus for name in shipped().models_in(text)]
    return tuple((n, None) for n in dict.fromkeys(names))


class Gpus(Section):
    count: int | None = None
    devices: list[Gpu] | None = None
    topology: list[GpuLink] | None = None
    visible: list[str] | None = None  # CUDA_VISIBLE_DEVICES, parsed; None when unset
    derived: ClassVar[tuple[str, ...]] = (
        "models",
        "distinct_models",
        "arch",
        "distinct_archs",
        "compute_capabilities",
        "consumer",
        "p2p_support",
        "min_cuda",
        "p2p_ok",
        "visible_duplicates",
        "processes_on_gpu0",
        "foreign_ranks_on_gpu0",
        "max_processes_per_gpu",
    )

    @property
    def models(self) -> list[str] | None:
        if not self.devices:
            return None
        return [d.name for d in self.devices if d.name]

    @property
    def distinct_models(self) -> int | None:
        models = self.models
        if not models:
            return None
        # nvidia-smi cuts long names ("NVIDIA GeForce ..."): GPUs whose memory totals differ by
        # over a tenth are different models even under one cut name (one model's totals differ
        # only by how each tool counts: 40960 MiB in nvidia-smi, 39.4 GiB in torch)
        totals = sorted(d.memory_total_mib for d in self.devices or [] if d.memory_total_mib)
        sizes = 1 + sum(b > a * 1.1 for a, b in zip(totals, totals[1:], strict=False)) if totals else 0
        return max(len(set(models)), sizes)

    _owner: _Owner = PrivateAttr(default_factory=_Owner)

    def _named(self) -> tuple[tuple[str | None, str | None], ...]:
        """(name, compute capability) of each GPU probed; without a probe, each model of
        kb/tables/gpus.yaml that a retained log line about GPUs names."""
        if self.devices:
            return tuple((d.name, d.compute_capability) for d in self.devices)
        lines = self._owner.facts.log.lines if self._owner.facts is not None else None
        if not lines:
            return ()
        # several derived facts ask; the lines are kept with the answer, so a log replaced or
        # grown since is read again
        memo = self._owner.memo.get("models_in_log")
        if memo is None or memo[0] is not lines or memo[1] != len(lines):
            memo = self._owner.memo["models_in_log"] = (lines, len(lines), _models_in_lines(lines))
        return memo[2]

    def _table_rows(self) -> tuple[tuple[Any, Any], ...]:
        from probes.tables import shipped

        return shipped().gpu_rows(self._named())

    def table_capabilities(self) -> list[Any]:
        """The kb/tables/gpus.yaml capability row of each GPU whose capability is known."""
        return [cap for _, cap in self._table_rows() if cap is not None]

    @property
    def compute_capabilities(self) -> list[str] | None:
        caps = list(dict.fromkeys(c.capability for c in self.table_capabilities()))
        return caps or None

    @property
    def arch(self) -> list[str] | None:
        """The architectures of the GPUs (ampere, hopper, blackwell...), from kb/tables/gpus.yaml."""
        archs = list(dict.fromkeys(c.arch for c in self.table_capabilities()))
        return archs or None

    @property
    def distinct_archs(self) -> int | None:
        archs = self.arch
        return len(archs) if archs else None

    @property
    def min_cuda(self) -> str | None:
        """The oldest CUDA runtime whose builds run on every one of these GPUs."""
        from probes.tables import version

        needs = [c.min_cuda for c in self.table_capabilities()]
        return max(needs, key=version) if needs else None

    @property
    def consumer(self) -> bool | None:
        """Any consumer (GeForce/TITAN) card: PCIe P2P on these is often unsupported or broken."""
        from probes.tables import shipped

        names = [n for n, _ in self._named() if n]
        if not names:
            return None
        models = [(n, shipped().gpu_model(n)) for n in names]
        return any(m.cls == "consumer" if m else bool(_CONSUMER_GPU.search(n)) for n, m in models)

    @property
    def p2p_support(self) -> list[str] | None:
        """What the driver offers for PCIe P2P on these models: supported, unreliable, unsupported."""
        support = list(dict.fromkeys(model.p2p for model, _ in self._table_rows() if model is not None))
        return support or None

    @property
    def p2p_ok(self) -> bool | None:
        if not self.topology:
            return None
        statuses = [s for link in self.topology for s in (link.p2p_read, link.p2p_write) if s]
        return all(s == "ok" for s in statuses) if statuses else None

    @property
    def visible_duplicates(self) -> bool | None:
        if self.visible is None:
            return None
        return len(set(self.visible)) != len(self.visible)

    def _gpu0(self) -> Gpu | None:
        return next((d for d in self.devices or [] if d.index == 0), None)

    @property
    def processes_on_gpu0(self) -> int | None:
        gpu0 = self._gpu0()
        return None if gpu0 is None or gpu0.processes is None else len(gpu0.processes)

    @property
    def foreign_ranks_on_gpu0(self) -> int | None:
        """Training ranks that hold memory on GPU 0 though their own GPU is another one (a
        checkpoint loaded there, a bare .cuda()); processes that are no rank do not count, so
        other jobs sharing the machine are not mistaken for this one. None where no process
        on GPU 0 could be matched to its GPU."""
        gpu0 = self._gpu0()
        if gpu0 is None or gpu0.processes is None:
            return None
        known = [p.own_gpu for p in gpu0.processes if p.own_gpu is not None]
        if gpu0.processes and not known:
            return None
        return sum(own != 0 for own in known)

    @property
    def max_processes_per_gpu(self) -> int | None:
        counts = [len(d.processes) for d in self.devices or [] if d.processes is not None]
        return max(counts) if counts else None


class Driver(Section):
    version: str | None = None
    cuda_version: str | None = None  # the newest CUDA runtime the driver supports
    # read with kb/tables/cuda.yaml against the CUDA runtime torch was built with
    derived: ClassVar[tuple[str, ...]] = ("min_for_torch_cuda", "supports_torch_cuda", "supports_gpus")
    _owner: _Owner = PrivateAttr(default_factory=_Owner)

    def _floors(self) -> tuple[str, str] | None:
        from probes.tables import shipped

        facts = self._owner.facts
        if facts is None or facts.torch.cuda is None:
            return None
        return shipped().min_driver(facts.torch.cuda, windows=facts.host.platform == "win32")

    @property
    def min_for_torch_cuda(self) -> str | None:
        """The driver the CUDA toolkit of torch's runtime lists as its minimum."""
        floors = self._floors()
        return floors[0] if floors else None

    @property
    def supports_torch_cuda(self) -> bool | None:
        """Whether this driver runs torch's CUDA runtime: newer, or of the same major version
        under minor version compatibility (CUDA 11.1 and later)."""
        from probes.tables import release, version

        floors, torch_cuda = self._floors(), release(self._owner.facts.torch.cuda) if self._owner.facts else None
        if torch_cuda is None:
            return None
        driver, installed = release(self.cuda_version), version(self.version)
        compat_ok = torch_cuda.major >= 11 and (installed is None or floors is None or installed >= version(floors[1]))
        if driver is not None:
            return driver >= torch_cuda or (driver.major == torch_cuda.major and compat_ok)
        if installed is None or floors is None:
            return None
        return installed >= version(floors[1] if torch_cuda.major >= 11 else floors[0])

    @property
    def supports_gpus(self) -> bool | None:
        """Whether this driver knows the job's GPUs: it must run the oldest CUDA they need."""
        from probes.tables import release, shipped, version

        facts = self._owner.facts
        needed = facts.gpus.min_cuda if facts is not None else None
        driver, installed = release(self.cuda_version), version(self.version)
        if needed is None or (driver is None and installed is None):
            return None
        if driver is not None:
            return driver >= release(needed)
        floors = shipped().min_driver(needed, windows=facts.host.platform == "win32")
        return None if floors is None else installed >= version(floors[0])


# --- launcher -------------------------------------------------------------------------------


class Launcher(Section):
    kind: str | None = None  # torchrun, slurm, mpirun, deepspeed, accelerate, none
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    node_rank: int | None = None
    nnodes: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    slurm_ntasks: int | None = None
    slurm_ntasks_per_node: int | None = None
    slurm_nnodes: int | None = None
    slurm_gpus_on_node: int | None = None
    strategy: str | None = None  # as requested by the job: ddp, ddp_spawn, fsdp, deepspeed
    devices_requested: int | None = None
    derived: ClassVar[tuple[str, ...]] = (
        "ranks_short_of_devices",
        "slurm_tasks_short_of_devices",
        "world_size_beyond_started",
        "multi_node",
    )
    _owner: _Owner = PrivateAttr(default_factory=_Owner)

    @property
    def ranks_short_of_devices(self) -> bool | None:
        """The process group formed with fewer ranks than the devices the job asked for: the ranks
        were counted by something other than the Trainer (SLURM's tasks, a launcher's nproc)."""
        if self.world_size is None or self.devices_requested is None:
            return None
        return self.world_size < self.devices_requested

    @property
    def slurm_tasks_short_of_devices(self) -> bool | None:
        """SLURM starts fewer tasks per node than the devices the job asks for per node (Lightning
        under SLURM runs one rank per task and starts none itself). None when either is unknown,
        or when a launcher on each node starts the ranks (torchrun's --nproc_per_node inside srun)."""
        if self.slurm_ntasks_per_node is None or self.devices_requested is None:
            return None
        if self.local_world_size is not None or self.kind not in (None, "slurm"):
            return None
        return self.slurm_ntasks_per_node < self.devices_requested

    @property
    def multi_node(self) -> bool | None:
        """Whether the job spans several hosts, however the facts show it: a launch for several
        nodes (--nnodes, SLURM's --nodes), NCCL's lines from two hostnames, or the report's own
        words (signature user_multi_node). False for a launch of one node; None when nothing says."""
        facts = self._owner.facts
        log = facts.log if facts is not None else None
        hosts = len(log.nccl.hosts) if log is not None and log.nccl is not None else 0
        said = any(s.id == "user_multi_node" for s in (log.signatures if log is not None else None) or [])
        # SLURM's allocation is where the job runs; a launcher's or Trainer's node count asked
        # for more than it (num_nodes=2 in one node's allocation) is a request, not more hosts
        nodes = self.slurm_nnodes if self.slurm_nnodes is not None else self.nnodes
        if (nodes or 0) >= 2 or hosts >= 2 or said:
            return True
        return False if nodes is not None else None

    @property
    def world_size_beyond_started(self) -> bool | None:
        """A world size the job states (a config's ``world_size: 16``, ``WORLD_SIZE=16``,
        ``--world_size 16``, the store barrier's own count) larger than the tasks SLURM starts
        for it (--ntasks, or --ntasks-per-node times --nodes): the group waits for ranks that
        never start. A torchrun's --nproc_per_node is not
        compared: reports name several ("it runs with --nproc_per_node=1, not 2") and the offline
        reading keeps one. None when either is unknown."""
        per_node = self.slurm_ntasks_per_node
        started = self.slurm_ntasks or (per_node * self.slurm_nnodes if per_node and self.slurm_nnodes else None)
        facts = self._owner.facts
        sizes = (facts.log.stated("world_size_stated", "size") if facts is not None else None) or []
        stated = [int(size) for (size,) in sizes if size.isdigit()]
        if not started or not stated:
            return None
        return max(stated) > started


# --- micro-tests ------------------------------------------------------------------------------

TestStatus = Literal["passed", "failed", "timed_out", "skipped", "error"]
Measurement = float | int | bool | str | None


# What each micro-test measures (probes/microtests/judge.py fills them; `diagnose cluster` adds
# joined/expected to rendezvous): rules may name these and no other, so a misspelt key is a load
# error rather than a check that is never true.
_SWEEP_SIZES = ("1KB", "4KB", "16KB", "64KB", "256KB", "1MB", "4MB", "16MB", "64MB")
MEASUREMENTS: dict[str, frozenset[str]] = {
    "rendezvous": frozenset({"init_s", "first_collective_s", "error_kind", "joined", "expected"}),
    "barrier": frozenset({"barrier_s", "missing_ranks", "missing_count", "arrived_count"}),
    "all_reduce": frozenset(
        {"correct", "dtype", "algbw_gbps_max", "busbw_gbps_max", "busbw_gbps_avg"}
        | {f"{kind}_{size}" for kind in ("time_us", "algbw_gbps", "busbw_gbps") for size in _SWEEP_SIZES}
    ),
    "placement": frozenset(
        {
            "nvml_pids_matched",
            "nvml_error",
            "foreign_ranks_on_gpu0",
            "gpu0_foreign_ranks",
            "ranks_on_foreign_device",
            "foreign_device_ranks",
        }
    ),
    "duplicate_gpu": frozenset(
        {"mode", "distinct_devices", "duplicates", "duplicate_ranks", "nccl_error", "nccl_rejects_shared"}
    ),
    "lightning_fit": frozenset({"strategy", "fit_s", "global_step", "loss_finite"}),
}


class MicroTest(_Model):
    status: TestStatus
    duration_s: float | None = None
    backend: str | None = None
    nproc: int | None = None
    reason: str | None = None  # why it was skipped
    error: str | None = None
    ranks: dict[str, str] = Field(default_factory=dict)  # rank -> last step reached / exit
    measurements: dict[str, Measurement] = Field(default_factory=dict)
    variants: dict[str, TestStatus] = Field(default_factory=dict)  # "p2p_disabled" -> passed


class MicroTests(Section):
    rendezvous: MicroTest | None = None
    barrier: MicroTest | None = None
    all_reduce: MicroTest | None = None
    placement: MicroTest | None = None
    duplicate_gpu: MicroTest | None = None
    lightning_fit: MicroTest | None = None


# --- what failed -----------------------------------------------------------------------------


class Frame(_Model):
    file: str
    line: int | None = None
    function: str | None = None


class Failure(_Model):
    """The exception the first failing rank raised, read from its own output."""

    rank: int | None = None
    exception: str | None = None  # the type, as printed: ValueError, torch.distributed.DistBackendError
    message: str | None = None
    user_frame: Frame | None = None  # innermost frame of the user's code in its traceback
    # the library (not torch) whose frame is innermost in the traceback: deepspeed, accelerate...
    library: str | None = None
    signatures: list[str] = Field(default_factory=list)  # what the catalog recognises in that traceback
    # a signature more specific than "a Python exception" names it: then the cascade is not the answer
    explained: bool | None = None


# --- logs -------------------------------------------------------------------------------------


class LogLine(_Model):
    no: int  # 1-based line number in its source
    text: str
    rank: int | None = None
    source: str | None = None


class Signature(_Model):
    id: str  # from probes.log.SIGNATURES
    line: int
    excerpt: str
    rank: int | None = None
    source: str | None = None
    data: dict[str, str] = Field(default_factory=dict)  # named groups: device, collective, ...


class NcclState(_Model):
    """What NCCL's own INFO lines say about communicator init (read by ``probes.logfacts``)."""

    net: str | None = None  # IB or Socket: the transport NCCL chose between nodes
    interfaces: list[str] = Field(default_factory=list)  # bootstrap and NET interfaces, as seen
    transports: list[str] = Field(default_factory=list)  # P2P/IPC, SHM, NET/IB ... between ranks
    init_completed: bool = False  # "Init COMPLETE" or "Connected all rings" seen
    nranks: int | None = None
    shared_devices: list[str] = Field(default_factory=list)  # host:busId opened by two processes
    hosts: list[str] = Field(default_factory=list)  # the hostnames NCCL's lines carry
    last_line: str | None = None  # the last NCCL line kept: where a stalled init stopped


# a traceback frame inside an installed library, by its path below site-packages (or a path
# elided to ".../lightning/..."), so that two nodes' environments compare
_LIBRARY_FRAME = _linear(
    r'File "(?:[^"]*?[/\\](?:site|dist)-packages[/\\]|\.\.\.[/\\])(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>[\w.<>]+)'
)
# the launcher's "[rank3]:" (torchrun's --tee / log prefix) before each line of a rank's output
RANK_PREFIX = _linear(r"^\[(?:rank|default)(\d+)\]:\s?")
# glog's prefix of torch's C++ messages, old ("[E ProcessGroupNCCL.cpp:563]") and new ("[E1104
# 09:12:03.551201 140221 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1418]"); the message's
# words after its own bracketed rank ("[Rank 2]", "[PG 0 (default_pg) Rank 2]"), without numbers
_CPP_POSITION = _linear(
    r"\[[EWIF]\d{0,4}(?: [\d:.]+ \d+)? (?:[\w.-]+/)*(?P<file>\w+\.(?:cpp|cc|hpp|h)):(?P<line>\d+)\]"
    r"(?:\s*\[[^\]]*\])*\s*(?P<message>[^\n]*)"
)
_CPP_MESSAGE_WORDS = re.compile(r"[A-Za-z]{2,}")
# the libraries' own code that syncs a metric or a logged value across ranks
_METRIC_SYNC = re.compile(
    r"(?:^|/)torchmetrics/|(?:^|/)(?:lightning/pytorch|pytorch_lightning)/trainer/connectors/logger_connector/"
)
# what says a job runs on GPUs (Log.mentions_gpu), and Lightning's banner for a CPU run
_GPU_JOB = _linear(
    # "TORCH_NCCL_...", "PYTORCH_CUDA_ALLOC_CONF": a variable's name joins the word with "_"
    r"(?i)(?:\b|_)nccl|(?:\b|_)cuda|\bnvidia|\bnvml|\bXid\b|\bgpu|多卡|单卡|双卡|显卡|显存|[0-9一二两三四五六七八]\s*(?:张|块)?卡"
)
_NO_GPU = _linear(r"(?i)\bgpu available:\s*false")
_NCCL = _linear(r"(?i)nccl")


class Log(Section):
    sources: list[str] = Field(default_factory=list)
    lines_read: int | None = None
    lines: list[LogLine] | None = None  # the retained lines rules' patterns run over
    signatures: list[Signature] | None = None
    nccl: NcclState | None = None  # None: no NCCL INFO line (NCCL_DEBUG unset, or no NCCL)
    # every NCCL release the log names: printed by NCCL, in an error, a library file or a package
    nccl_versions: list[str] | None = None
    failure: Failure | None = None  # the first failing rank's exception, from its traceback
    exit_codes: list[int] | None = None  # as launchers report ranks' ends (-9, 137, 1 ...)
    exit_signals: list[str] | None = None  # signal names (KILL, SEGV, BUS ...) as printed or implied by exit codes
    derived: ClassVar[tuple[str, ...]] = (
        "signature_ids", "failing_ranks", "nccl_versions_differ", "store_overcounted", "ends_joining_group",
        "ends_out_of_data", "mentions_gpu", "backend", "ranks_vs_visible", "shapes_differ_across_ranks",
        "torch_versions_differ", "images_differ", "library_code_skew",
        "store_short",
    )  # fmt: skip

    @property
    def mentions_gpu(self) -> bool | None:
        """A line names a GPU, CUDA, NCCL, NVML, NVIDIA or an Xid (in Chinese also cards: 多卡, 4卡,
        显卡, 显存): a job on GPUs, which rules whose cause needs one gate on. Lightning's "GPU
        available: False" does not count. None when no log was read."""
        if self.lines is None:
            return None
        return any(_GPU_JOB.search(_NO_GPU.sub("", line.text)) for line in self.lines)

    @property
    def backend(self) -> str | None:
        """The process-group backend the job ran on, when the log names exactly one: a library's
        own line (signatures pg_backend: Lightning's "distributed_backend=gloo", accelerate's
        "Backend: gloo", gloo's or ProcessGroupNCCL's errors; deepspeed_dist_init), and any line
        naming NCCL counts for NCCL. None when it names none, or several (a job may keep a gloo
        group beside its NCCL one): so "gloo" means NCCL is nowhere in the log."""
        if self.signatures is None or self.lines is None:
            return None
        named = {
            s.data["backend"].lower()
            for s in self.signatures
            if s.id in ("pg_backend", "deepspeed_dist_init") and s.data.get("backend")
        }
        if "nccl" not in named and any(_NCCL.search(line.text) for line in self.lines):
            named.add("nccl")
        return named.pop() if len(named) == 1 else None

    @property
    def ends_joining_group(self) -> bool | None:
        """The log's last event is a rank starting to join the process group (Lightning's
        "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2", DeepSpeed's init_distributed),
        never followed by the group forming or by a failure: a job that stopped there stopped in
        the rendezvous, before any model was loaded or step run. None when no log was read."""
        from probes.symptoms import ends_joining_group

        return None if self.signatures is None or self.lines is None else ends_joining_group(self)

    @property
    def ends_out_of_data(self) -> bool | None:
        """The log's last events are ranks saying their data ran out (icefall's "Reaches end of
        dataloader"), with no failure after: those ranks wait in their next collective for ranks
        that still had batches. None when no log was read."""
        from probes.symptoms import ends_out_of_data

        return None if self.signatures is None or self.lines is None else ends_out_of_data(self)

    def _store_waits(self) -> list[tuple[int, int, int]]:
        """(line, world size, worker count) of each wait of torch's store-based barrier that
        printed its counts, in log order."""
        return [
            (s.line, int(s.data["world_size"]), int(s.data["worker_count"]))
            for s in self.signatures or []
            if s.id == "store_barrier_wait" and s.data.get("world_size", "").isdigit()
            and s.data.get("worker_count", "").isdigit()
        ]  # fmt: skip

    @property
    def store_overcounted(self) -> bool | None:
        """torch's store-based barrier counted more workers than the world size: the store (a
        file:// init file, a reused key) still holds the joins of an earlier run, so the count it
        waits for never comes out right. None when no barrier wait with its counts was logged."""
        if self.signatures is None:
            return None
        waits = self._store_waits()
        return any(workers > world for _, world, workers in waits) if waits else None

    @property
    def ranks_vs_visible(self) -> str | None:
        """How the processes a command line starts compare with the GPUs its CUDA_VISIBLE_DEVICES
        leaves (``CUDA_VISIBLE_DEVICES=1,3 accelerate launch --num_processes=2``): "equal",
        "more_ranks" (ranks past the last visible GPU ask for a device that does not exist) or
        "fewer_ranks" (visible GPUs stay idle). The last such command counts. None when no line
        sets both."""
        if self.signatures is None:
            return None
        launches = [s.data for s in self.signatures if s.id == "launch_masked" and s.data.get("nproc")]
        if not launches:
            return None
        visible = len([d for d in launches[-1]["visible"].split(",") if d])
        nproc = int(launches[-1]["nproc"])
        return "equal" if nproc == visible else "more_ranks" if nproc > visible else "fewer_ranks"

    @property
    def shapes_differ_across_ranks(self) -> bool | None:
        """Whether ranks printed different shapes for the same tensor ("[rank0] boxes
        torch.Size([112, 4])", "[rank1] boxes torch.Size([87, 4])"): a collective over it (an
        all_gather of equal-sized buffers, a broadcast into a preallocated one) gets mismatched
        sizes. None when no tensor's shape was printed by two ranks."""
        if self.signatures is None:
            return None
        shapes: dict[str, dict[str, str]] = {}
        for s in self.signatures:
            if s.id == "rank_tensor_shape":
                shape = "".join((s.data.get("size") or s.data.get("shape") or "").split())
                shapes.setdefault(s.data.get("what", ""), {})[str(s.rank)] = shape
        compared = [set(by_rank.values()) for by_rank in shapes.values() if len(by_rank) > 1]
        return any(len(seen) > 1 for seen in compared) if compared else None

    @property
    def store_short(self) -> bool | None:
        """torch's store-based barrier was last seen waiting with fewer workers than the world size,
        and the group never formed after it: ranks the world size counts were never started (or
        cannot join). False when start-up completed after the wait; None when no wait was logged."""
        waits = self._store_waits() if self.signatures is not None else []
        if not waits:
            return None
        line, world, workers = waits[-1]
        if any(s.id == "startup_done" and s.line > line for s in self.signatures or []):
            return False
        return workers < world

    def stated(self, signature: str, *keys: str) -> list[tuple[str, ...]] | None:
        """The values the lines with ``signature`` state. The reader keeps a line's first; a line
        that names nodes one by one (signature nodes_named_apart: "node1 has torch 1.13, node2
        torch 2.0") gives every one, as each is a node's own."""
        if self.signatures is None:
            return None
        from probes.signatures import shipped

        known = shipped().signatures.get(signature)
        apart = {s.line for s in self.signatures if s.id == "nodes_named_apart"}
        found = []
        for s in self.signatures:
            if s.id == signature:
                every = known.every(s.excerpt) if known and s.line in apart else ()
                found.extend(tuple(data.get(k, "").lower() for k in keys) for data in [s.data, *every])
        return found

    @property
    def torch_versions_differ(self) -> bool | None:
        """Whether the report states two torch releases or builds ("torch 2.1.2+cu121" printed on
        one node, "2.2.1+cu121" on another; two pip listings): ranks or nodes that run different
        torch, or a report comparing releases. A release stated shorter ("torch 2.1" beside
        "2.1.2+cu121") is the same one. None when no torch release is stated."""
        stated = {version for (version,) in self.stated("torch_release_stated", "version") or []}
        if not stated:
            return None
        distinct = {v for v in stated if not any(w != v and w.startswith((v + ".", v + "+")) for w in stated)}
        return len(distinct) > 1

    @property
    def images_differ(self) -> bool | None:
        """Whether one container image is named with two tags or digests ("pytorch:23.10-py3" and
        "pytorch:24.03-py3"; two sha256 digests of one tag): containers that run different stacks.
        None when no image is named."""
        stated = self.stated("container_image", "image", "tag")
        if not stated:
            return None
        tags: dict[str, set[str]] = {}
        for image, tag in stated:
            tags.setdefault(image, set()).add(tag)
        return any(len(seen) > 1 for seen in tags.values())

    @property
    def library_code_skew(self) -> bool | None:
        """Whether one line of an installed library's code is quoted at two line numbers of its
        file: the same statement of the same function (``fit_loop.py", line 359, in advance`` in
        one node's traceback, ``line 375`` in another's) can only move between releases, so two
        releases of that library ran in the job. torch's C++ log lines count the same way: one
        message at two positions of its source (``[E ProcessGroupNCCL.cpp:563]`` and ``:475``
        before "Watchdog caught collective operation timeout"). None when neither is quoted."""
        if self.lines is None:
            return None
        seen: dict[tuple[str, str, str], set[str]] = {}
        for line in self.lines:  # torch's own C++ log lines: one message, two source positions
            m = _CPP_POSITION.search(line.text)
            words = _CPP_MESSAGE_WORDS.findall(m.group("message")) if m else []
            if len(words) >= 3:
                seen.setdefault((m.group("file"), "", " ".join(words[:5]).lower()), set()).add(m.group("line"))
        for frame, code in itertools.pairwise(self.lines):
            m = _LIBRARY_FRAME.search(frame.text)
            if m is None or code.no != frame.no + 1 or code.source != frame.source:
                continue
            quoted = RANK_PREFIX.sub("", code.text.lstrip()).strip()
            if quoted and not quoted.startswith(("File ", "^", "~")):
                seen.setdefault((m.group("path"), m.group("function"), quoted), set()).add(m.group("line"))
        return any(len(lines) > 1 for lines in seen.values()) if seen else None

    @property
    def nccl_versions_differ(self) -> bool | None:
        """Two NCCL releases in one job: ranks, nodes or libraries that disagree."""
        return None if self.nccl_versions is None else len(self.nccl_versions) > 1

    @property
    def signature_ids(self) -> list[str] | None:
        return None if self.signatures is None else sorted({s.id for s in self.signatures})

    @property
    def failing_ranks(self) -> list[int] | None:
        if self.signatures is None:
            return None
        return sorted({s.rank for s in self.signatures if s.rank is not None})


# --- hangs ------------------------------------------------------------------------------------


class Collective(_Model):
    """One Flight Recorder entry: a collective as this rank recorded it."""

    seq: int | None = None  # collective sequence id within its process group
    op: str | None = None  # all_reduce, barrier, ... (backend prefix dropped)
    state: str | None = None  # scheduled, started, completed
    pg: str | None = None  # process group name
    frame: Frame | None = None  # the innermost frame of the user's code that issued it
    sizes: list[list[int]] | None = None  # input tensor shapes


class Straggler(_Model):
    """A collective some ranks of a process group entered and others never reached."""

    pg: str | None = None
    seq: int
    op: str | None = None
    entered: list[int] = Field(default_factory=list)
    missing: list[int] = Field(default_factory=list)
    ops: dict[str, str] = Field(default_factory=dict)  # rank -> op, when ranks disagree on seq


class SourceCall(_Model):
    """A call in the job's own source that synchronises ranks, inside a branch only some
    ranks take (``if self.trainer.is_global_zero:``, ``if rank == 0:``, ``@rank_zero_only``)."""

    file: str
    line: int
    call: str  # self.log, dist.barrier, self.all_gather, ...
    condition: str  # the branch's test as written, or the decorator


class RankStack(_Model):
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    host: str | None = None
    method: str | None = None  # py-spy, faulthandler
    state: str | None = None
    waiting_in: str | None = None  # barrier, all_reduce, init_process_group, ...
    frames: list[Frame] = Field(default_factory=list)
    user_frame: Frame | None = None  # innermost frame of the user's own code
    library_frame: Frame | None = None  # the recognised library call it waits in (``waiting_in``'s frame)
    # collective: waits on its peers; data: for a batch; io: loading, saving, importing;
    # compute: its own work (or a sleep); exited: gone while the others still ran
    activity: Literal["collective", "data", "io", "compute", "exited"] | None = None
    rank_branch: str | None = None  # the test of a rank-only branch one of its user frames is in
    collectives: list[Collective] | None = None  # Flight Recorder: the last ones, oldest first


class Hang(Section):
    detected: bool | None = None
    ranks: list[RankStack] | None = None
    # a supervised run (`diagnose run`): how the job ended and how long it was silent
    outcome: Literal["finished", "crashed", "hung", "interrupted"] | None = None
    exit_code: int | None = None
    idle_s: float | None = None
    stragglers: list[Straggler] | None = None  # from Flight Recorder dumps
    # the Flight Recorder read as sequences where ranks part: uneven-iterations (the same
    # collective repeated until some ranks do one more), size-mismatch (one op, different
    # shapes), different-ops (different ops at one sequence number), rank-behind (some ranks
    # never issued what the others wait in), in-step
    sequence: Literal["uneven-iterations", "size-mismatch", "different-ops", "rank-behind", "in-step"] | None = None
    slow_ranks: list[int] | None = None  # ranks busy with their own work while all others wait in a collective
    rank_zero_calls: list[SourceCall] | None = None  # collectives in the job's source that only some ranks reach
    first_failure: Failure | None = None  # a crashed job: the first failing rank's exception
    last_output: str | None = None  # the job's last line of output before the hang
    derived: ClassVar[tuple[str, ...]] = (
        "waiting_in", "divergent", "rank_branch_waits", "rank_zero_call_sites", "metric_sync_waits",
    )  # fmt: skip

    @property
    def waiting_in(self) -> list[str] | None:
        if not self.ranks:
            return None
        return sorted({r.waiting_in or "unknown" for r in self.ranks})

    @property
    def metric_sync_waits(self) -> bool | None:
        """Whether a rank waits in a collective that a metric or logging library issued for it
        (torchmetrics' state sync, Lightning's logged-value reduce of self.log(sync_dist=True)):
        a sync that every rank must reach, called where only some do. None without stacks."""
        if not self.ranks:
            return None
        return any(
            r.activity == "collective" and any(_METRIC_SYNC.search(f.file.replace("\\", "/")) for f in r.frames)
            for r in self.ranks
        )

    @property
    def divergent(self) -> bool | None:
        """Ranks stuck in different places: the signature of a collective reached by a subset."""
        places = self.waiting_in
        return None if places is None else len(places) > 1

    @property
    def rank_branch_waits(self) -> bool | None:
        """Some rank waits in a collective it reached through a branch only some ranks take."""
        if not self.ranks:
            return None
        return any(r.activity == "collective" and r.rank_branch for r in self.ranks)

    @property
    def rank_zero_call_sites(self) -> list[str] | None:
        """``FILE:LINE CALL under CONDITION`` for each of ``rank_zero_calls``: rules match the
        call, evidence shows the line a fix has to change."""
        if self.rank_zero_calls is None:
            return None
        return [f"{c.file}:{c.line} {c.call} under {c.condition}" for c in self.rank_zero_calls]


# --- the whole --------------------------------------------------------------------------------


class ProbeError(_Model):
    probe: str
    message: str


# --- cluster: one job across nodes, gathered by its rank 0 (compared in probes.clusterfacts) --


class ClusterRank(_Model):
    rank: int
    node: str | None = None  # the name of its node, as in ``Cluster.nodes``
    local_rank: int | None = None
    pid: int | None = None
    # reported: it sent its facts; silent: it joined but its facts never came; missing: never joined
    state: Literal["reported", "silent", "missing"]
    step: str | None = None  # the last step it announced: where a silent rank got to
    error: str | None = None
    device: str | None = None  # cuda:0, cpu
    device_name: str | None = None
    device_uuid: str | None = None


class ClusterNode(_Model):
    """One node's own facts, collected once on it by its local rank 0."""

    name: str  # DIAGNOSE_NODE_NAME, else SLURMD_NODENAME, else the hostname
    node_rank: int | None = None
    hostname: str | None = None
    ranks: list[int] = Field(default_factory=list)
    reported: bool = False  # its node facts arrived at rank 0
    intra_busbw_gbps: float | None = None  # all_reduce among its own ranks
    inter_gbps: float | None = None  # send/recv between rank 0 and this node's first rank
    host: Host | None = None
    packages: Packages | None = None
    env: Env | None = None
    torch: TorchBuild | None = None
    gpus: Gpus | None = None
    driver: Driver | None = None
    launcher: Launcher | None = None
    errors: list[ProbeError] = Field(default_factory=list)

    def versions(self) -> dict[str, str | None]:
        """The components that must match across nodes, by name."""
        t, p = self.torch, self.packages
        return {
            "torch": t.version if t else None,
            "cuda": t.cuda if t else None,
            "cudnn": t.cudnn if t else None,
            "nccl": t.nccl if t else None,
            "driver": self.driver.version if self.driver else None,
            "python": self.host.python if self.host else None,
            "lightning": p.values.get("lightning") if p else None,
            "pytorch-lightning": p.values.get("pytorch-lightning") if p else None,
        }

    @property
    def gpu_slots(self) -> int | None:
        """GPUs the job may use here: SLURM's allocation when it says, else what NVML sees."""
        if self.launcher and self.launcher.slurm_gpus_on_node is not None:
            return self.launcher.slurm_gpus_on_node
        return self.gpus.count if self.gpus else None


class Cluster(Section):
    world_size: int | None = None
    nnodes: int | None = None  # nodes expected
    backend: str | None = None
    nodes: list[ClusterNode] = Field(default_factory=list)
    ranks: list[ClusterRank] = Field(default_factory=list)
    derived: ClassVar[tuple[str, ...]] = (
        "missing_ranks",
        "missing_nodes",
        "silent_ranks",
        "differing_env",
        "differing_versions",
        "gpu_models",
        "distinct_gpu_models",
        "slow_nodes",
        "ranks_exceed_gpus",
        "gpus_exceed_ranks",
        "shared_devices",
    )

    def _reported(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.reported]

    @property
    def missing_ranks(self) -> list[int] | None:
        return [r.rank for r in self.ranks if r.state == "missing"] if self.ranks else None

    @property
    def missing_nodes(self) -> list[str] | None:
        """Nodes none of whose ranks joined."""
        return clusterfacts.missing_nodes((r.node, r.state) for r in self.ranks) if self.ranks else None

    @property
    def silent_ranks(self) -> list[int] | None:
        return [r.rank for r in self.ranks if r.state == "silent"] if self.ranks else None

    @property
    def differing_env(self) -> list[str] | None:
        """Job-wide variables (NCCL_*, TORCH_*, ...) whose value differs between nodes; unset counts."""
        return clusterfacts.differing_env(
            [n.env.values for n in self._reported() if n.env is not None and n.env.complete]
        )

    @property
    def differing_versions(self) -> list[str] | None:
        """Components (torch, cuda, nccl, driver, lightning, ...) with different versions on different nodes."""
        return clusterfacts.differing_versions([n.versions() for n in self._reported()])

    @property
    def gpu_models(self) -> list[str] | None:
        models = {m for n in self._reported() if n.gpus and n.gpus.models for m in n.gpus.models}
        return sorted(models) if models else None

    @property
    def distinct_gpu_models(self) -> int | None:
        models = self.gpu_models
        return len(models) if models else None

    @property
    def slow_nodes(self) -> list[str] | None:
        return clusterfacts.slow_nodes([(n.name, n.inter_gbps) for n in self.nodes if n.inter_gbps is not None])

    def _slots_vs_ranks(self) -> list[tuple[str, int, int]] | None:
        pairs = [(n.name, len(n.ranks), n.gpu_slots) for n in self._reported()]
        known = [(name, ranks, slots) for name, ranks, slots in pairs if slots]
        return known or None

    @property
    def ranks_exceed_gpus(self) -> list[str] | None:
        """Nodes running more ranks than they have GPUs: two ranks share a device."""
        pairs = self._slots_vs_ranks()
        return None if pairs is None else clusterfacts.ranks_exceed_gpus(pairs)

    @property
    def shared_devices(self) -> list[str] | None:
        """Ranks that took the same GPU (by UUID) on one node, as ``"node: ranks 0,1"``."""
        return clusterfacts.shared_devices((r.node, r.device_uuid, r.rank) for r in self.ranks if r.device_uuid)

    @property
    def gpus_exceed_ranks(self) -> list[str] | None:
        """Nodes with GPUs that no rank uses."""
        pairs = self._slots_vs_ranks()
        return None if pairs is None else clusterfacts.gpus_exceed_ranks(pairs)


class Skipped(_Model):
    what: str
    reason: str


class Facts(_Model):
    schema_version: int = SCHEMA_VERSION
    created: str | None = None  # ISO 8601, UTC
    inputs: list[str] = Field(default_factory=list)  # "live", "report:env.txt", "log:train.log"
    host: Host = Field(default_factory=Host)
    packages: Packages = Field(default_factory=Packages)
    env: Env = Field(default_factory=Env)
    torch: TorchBuild = Field(default_factory=TorchBuild)
    gpus: Gpus = Field(default_factory=Gpus)
    driver: Driver = Field(default_factory=Driver)
    launcher: Launcher = Field(default_factory=Launcher)
    microtests: MicroTests = Field(default_factory=MicroTests)
    log: Log = Field(default_factory=Log)
    hang: Hang = Field(default_factory=Hang)
    errors: list[ProbeError] = Field(default_factory=list)
    skipped: list[Skipped] = Field(default_factory=list)
    # a multi-node job (`diagnose cluster`): the sections above are then rank 0's node
    cluster: Cluster | None = None
    derived: ClassVar[tuple[str, ...]] = ("symptoms",)

    @model_validator(mode="after")
    def _bind_sections(self) -> Facts:
        # derived facts that weigh two sections (torch.supports_gpu_arch reads the GPUs) reach
        # their siblings through this link; assigning a section re-runs it for the new one
        for section in (self.packages, self.torch, self.gpus, self.driver, self.launcher):
            section._owner.facts = self
        return self

    @property
    def symptoms(self) -> list[str]:
        """The symptoms these facts show (``probes.symptoms``), sorted; derived, never stored."""
        from probes.symptoms import observe

        return sorted(observe(self))

    @model_serializer(mode="wrap")
    def _single_machine_unchanged(self, handler: Any) -> Any:
        # a single-machine snapshot reads exactly as before the cluster shape existed
        data = handler(self)
        if self.cluster is None and isinstance(data, dict):
            data.pop("cluster", None)
        return data
