"""Read a pasted environment report into a partial ``Facts`` (provenance ``report``).

``parse_report(text, name)`` understands, in any mix and in any order:

* ``python -m torch.utils.collect_env`` (torch 1.0 to today): versions, OS, GPUs, driver,
  the ``[pip3]`` / ``[conda]`` package lines (``nvidia-nccl-cu12`` gives the NCCL that pip
  builds of torch load), the lscpu ``CPU(s):`` count;
* Lightning's bug-report environment: the ``collect_env_details`` tree (``* CUDA:`` /
  ``- GPU:`` / ``* Packages:`` / ``* System:``) and the free-form bullets users write
  (``- PyTorch Version (e.g., 2.0): 2.1``, ``- GPU models and configuration: 4x A100``);
* ``accelerate env`` and ``transformers-cli env`` bullets, and an accelerate config
  (``distributed_type``, ``num_processes``, ``num_machines``);
* DeepSpeed ``ds_report`` (``torch version ....... 2.0.1``, shared memory size);
* ``nvidia-smi`` (header, device rows, process table), ``nvidia-smi -L``, ``nvidia-smi topo -m``;
* the headers of nccl-tests and CUDA's ``p2pBandwidthLatencyTest`` (device names,
  ``CANNOT Access Peer``);
* ``pip freeze`` lines, ``conda list`` tables (a ``pytorch`` / ``_pytorch_select`` build string
  says CPU or which CUDA), and ``VAR=value`` lines of allow-listed variables (NCCL_*, CUDA_*, ...).

Anything else is ignored: a value is taken only where its key is known and the value has
the expected shape (a version where a version belongs), so prose is not misread as a
fact. Packages stay incomplete (``complete=False``): a package the report does not name
is unknown, not absent. Nothing here raises on any text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from probes.env import allowed, redact_value
from probes.facts import Facts, Gpu, GpuLink, GpuProcess, canonical_package

_VERSION = re.compile(r"v?(\d+(?:\.\d+)+(?:[\w.+-]*\w)?|\d+(?=\s|$))")
_BOOL = {"true": True, "yes": True, "false": False, "no": False}
_NOT_KNOWN = re.compile(r"(?i)^(?:n/?a|none|could not collect|not installed|unknown|-+|\?+)?\s*$")

_FENCE_OR_TAG = re.compile(r"^\s*(?:```.*|~~~.*|</?(?:details|summary|pre|code|br)\b[^>]*>.*)$", re.IGNORECASE)
_BULLET = re.compile(r"^(?P<indent>[\s>]*)(?:#\s*)?(?:[-*+•]\s+)?")
_QUOTE = re.compile(r"^\s*(?:>\s?)+")
_KEY_VALUE = re.compile(r"^(?P<key>[^:]{1,80}?)\s*:\s*(?P<value>.*)$")
_EXAMPLE = re.compile(r"\(\s*e\.?\s*g\.?[^)]*\)", re.IGNORECASE)
# Ultralytics' banner (YOLOv5 to YOLO11), pasted in most of their bug reports:
# "Ultralytics 8.3.100 🚀 Python-3.12.9 torch-2.8.0+cu128 CUDA:0 (NVIDIA GeForce RTX 5090, 32112MiB)";
# further devices follow on the same or the next lines as "CUDA:1 (NAME, MEMMiB)"
_ULTRALYTICS_TORCH = re.compile(
    r"(?:\bPython-(?P<python>\d+\.\d+[\d.]*) )?\btorch[- ](?P<torch>\d+\.\d+\S*) (?:CUDA:\d|CPU\b|MPS\b)"
)
_ULTRALYTICS_GPU = re.compile(r"\bCUDA:(?P<index>\d+) \((?P<name>[^,()]+), (?P<mib>\d+(?:\.\d+)?) ?Mi?B\)")
# a UUID cut short in a pasted report ("GPU-6f1c0e2a-...") is no UUID, and no part of the name
_GPU_LINE = re.compile(
    r"^GPU (?P<index>\d+): (?P<name>.+?)(?: \(UUID: (?:(?P<uuid>GPU-[\w-]+)|GPU-[\w-]*(?:\.\.\.|…))\))?\s*$"
)
# the default name each desktop gives a screenshot, kept in a pasted image's link: GNOME's
# "Screenshot from 2022-12-12 17-11-14", macOS's "Screen Shot 2022-12-12 at 5.11.14 PM" (or
# "Screenshot 2023-05-18 at 10.25.23"), Windows 11's Snipping Tool "Screenshot 2023-05-18 102523"
_SCREENSHOT_PLATFORM = (
    (re.compile(r"\bScreenshot from \d{4}-\d{2}-\d{2} \d{2}-\d{2}-\d{2}"), "linux"),
    (re.compile(r"\bScreen ?[Ss]hot \d{4}-\d{2}-\d{2} at \d{1,2}\.\d{2}\.\d{2}"), "darwin"),
    (re.compile(r"\bScreenshot \d{4}-\d{2}-\d{2} \d{6}\b"), "win32"),
)
# NVIDIA GPU Feature Discovery's node label (kubectl get node ... labels): one per node, the
# model with its spaces made dashes ("NVIDIA-A100-SXM4-80GB")
_GFD_PRODUCT = re.compile(r"""nvidia\.com/gpu\.product["']?\s*[:=]\s*["']?(?P<model>NVIDIA-[\w.-]+|Tesla-[\w.-]+)""")
# srun -l (and mpirun --tag-output) put the task's label before each line: "1: GPU 0: Tesla V100"
# (nvidia-smi -L) is task 1's GPU 0, another node's device where task 0 named its own GPU 0. Only
# that listing: a labelled nvidia-smi table's process list would still mix the nodes' GPUs
_TASK_LABEL = re.compile(r"^(?P<task>\d{1,4}): (?=GPU \d+: )")
# several on one line, as a report's bullet sums them up: "- GPU 0: NVIDIA GeForce RTX 3090, GPU 1: ..."
_GPU_IN_LIST = re.compile(r"\bGPU (?P<index>\d+): (?P<name>[^,;|]+?)\s*(?=[,;|]\s*GPU \d+:|$)")
_PIP_LINE = re.compile(r"^\[(?P<tool>pip3?|conda)\]\s+(?P<rest>.+)$")
_CONDA_HEADER = re.compile(r"^#\s*Name\s+Version\s+Build(?:\s+Channel)?\s*$")
_FREEZE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[\w.+!-]+)\s*$")
# "deepspeed 0.8.0": `pip list` rows and hand-written version lines. Only for the packages a
# diagnosis weighs, so that "Ubuntu 20.04" or "Python 3.8" never becomes a package.
_NAME_VERSION = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9._-]*)\s+v?(?P<version>\d+(?:\.\d+)+[\w.+!-]*)\s*$")
_TRACKED = frozenset(
    "torch lightning pytorch-lightning lightning-fabric deepspeed accelerate bitsandbytes transformers "
    "peft triton xformers apex torchvision torchaudio nvidia-nccl-cu11 nvidia-nccl-cu12 torchmetrics".split()
)
_ENV_LINE = re.compile(r"^(?:export\s+)?(?P<name>[A-Z][A-Z0-9_]*)=(?P<value>\S*)\s*$")
# a container's environment in a Kubernetes manifest or a compose file: "- name: NCCL_DEBUG" with
# "value: INFO" on the next line, or both in one flow mapping
_ENV_ENTRY_NAME = re.compile(r"^-?\s*name:\s*[\x22\x27]?(?P<name>[A-Z][A-Z0-9_]*)[\x22\x27]?\s*$")
_ENV_ENTRY_VALUE = re.compile(r"^value:\s*(?P<value>\S.*?)\s*$")
# set from Python ("os.environ['NCCL_P2P_DISABLE'] = '1'", os.environ.setdefault(...)); not a
# variable set before a command on its line, which reports mostly show as the fix that worked
_ENV_PYTHON = re.compile(
    r"""os\.environ(?:\[\s*["'](?P<name>[A-Z][A-Z0-9_]*)["']\s*\]\s*=|\.setdefault\(\s*["'](?P<key>[A-Z][A-Z0-9_]*)["']\s*,)"""
    r"""\s*["'](?P<value>[^"'\n]*)["']"""
)
_ENV_ENTRY_FLOW = re.compile(
    r"^-?\s*\{\s*name:\s*[\x22\x27]?(?P<name>[A-Z][A-Z0-9_]*)[\x22\x27]?\s*,\s*value:\s*(?P<value>[^,}]+?)\s*\}\s*$"
)
_DOTTED = re.compile(r"^(?P<key>[A-Za-z][^.\[]*?)\s*\.{3,}\s*(?P<value>.+)$")

_SMI_HEADER = re.compile(
    r"NVIDIA-SMI\s+(?P<smi>[\d.]+)\s+(?:Driver|KMD) Version:\s+(?P<driver>[\d.]+)\s+CUDA (?:UMD )?Version:\s+"
    r"(?P<cuda>[\d.]+|N/A)"
)
_SMI_ROW = re.compile(
    r"^\|\s*(?P<index>\d+)\s+(?P<name>.+?)\s+(?P<persist>On|Off)\s*\|\s*(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
    r"[0-9A-Fa-f]{2}\.\d)\s+(?:On|Off)\s*\|\s*(?P<ecc>\S+)\s*\|"
)
_SMI_USAGE = re.compile(
    r"^\|\s*\S+\s+(?:\d+C|N/A)\s+(?:P\d+|N/A)\s+.*?\|\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*\|"
    r"\s*(?:\d+%|N/A)\s+(?P<mode>\S[^|]*?)\s*\|"
)
_SMI_MIG = re.compile(r"^\|\s*\|\s*\|\s*(?P<mig>Disabled|Enabled|N/A)\s*\|\s*$")
_SMI_PROCESS = re.compile(
    r"^\|\s+(?P<gpu>\d+)\s+(?:\S+\s+\S+\s+)?(?P<pid>\d+)\s+(?P<type>C\+G|C|G|M\+C|M)\s+(?P<name>.+?)\s+"
    r"(?:(?P<mem>\d+)MiB|N/A)\s*\|$"
)
# a process row whose GPU-instance and compute-instance columns are there ("0 N/A N/A 2579940 C
# python 13724MiB") is a process row even when the user pasted it without the table's header
_SMI_PROCESS_ROW = re.compile(
    r"^\|?\s*(?P<gpu>\d+)\s+(?:N/A|\d+)\s+(?:N/A|\d+)\s+(?P<pid>\d+)\s+(?P<type>C\+G|C|G|M\+C|M)\s+"
    r"(?P<name>\S.*?)\s+(?P<mem>\d+)MiB\s*\|$"
)
_TOPO_HEADER = re.compile(r"^\s*(?P<cols>(?:GPU\d+\s+)+)")
_TOPO_ROW = re.compile(r"^GPU(?P<index>\d+)\s+(?P<cells>(?:(?:X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)(?:\s+|$))+)")
_P2P_ROW = re.compile(r"^GPU(?P<index>\d+)\s+(?P<cells>(?:(?:X|OK|CNS|GNS|TNS|NS|DR|U)(?:\s+|$))+)$")
_P2P_STATUS = {
    "OK": "ok",
    "CNS": "not_supported",
    "GNS": "not_supported",
    "TNS": "not_supported",
    "NS": "not_supported",
    "DR": "disabled",
    "U": "unknown",
}
_P2P_DEVICE = re.compile(
    r"^Device: (?P<index>\d+), (?P<name>.+?), pciBusID: (?P<bus>\w+), pciDeviceID: \w+, pciDomainID:\s*(?P<domain>\w+)"
)
_P2P_ACCESS = re.compile(r"^Device=(?P<a>\d+) (?P<can>CAN|CANNOT) Access Peer Device=(?P<b>\d+)")
_NCCL_TESTS_RANK = re.compile(
    r"^#\s+Rank\s+\d+(?:\s+Group\s+\d+)?\s+Pid\s+\d+\s+on\s+(?P<host>\S+)\s+device\s+(?P<index>\d+)\s+"
    r"\[(?P<bus>[^\]]+)\]\s+(?P<name>.+?)\s*$"
)
_GPU_WORDS = re.compile(
    r"(?i)nvidia|geforce|rtx|gtx|tesla|quadro|titan|radeon|instinct|\b(?:[AHLVKPTB]\d{1,3}|A\d{4}|MI\d{3}|"
    r"GH\d{3}|GB\d{3}|[1-5]0[5-9]0(?:\s?ti)?)\b"
)
# a bare "L4" or "A10" in prose is a block, a layer or a paper section unless the line is about GPUs
# ("2080 Ti": only a GeForce is a Ti)
_GPU_CONTEXT = re.compile(r"(?i)nvidia|geforce|\brtx|\bgtx|tesla|quadro|titan|\bgpus?\b|\b\d{3,4} ?ti\b|显卡|卡")
# two GPU models joined in one machine: "3090 + 2080 Ti", "A100 & V100", "next to", "in the same box", 混插
_GPUS_TOGETHER = re.compile(
    r"(?i)(?:\bti|\d|gb)\s*[+&]\s*(?:\d+\s*[x×]\s*)?(?:nvidia |geforce |rtx |gtx |tesla |titan |quadro )?[a-z]{0,2}\s?\d"
    r"|\bnext to\b|\balongside\b|\btogether with\b|\bpaired with\b|混插|混用|混搭"
    r"|\b(?:in|on) (?:the )?same (?:machine|box|server|node|host|computer|pc|workstation)\b|同一(?:台|个)(?:机器|服务器|主机)"
)
_GPU_COUNT = re.compile(
    r"(?i)^(?:(?P<pre>\d+)\s*(?:[x×*]\s*|gpus?\s+(?:of\s+)?)?(?=\D)|(?P<word>single|one|dual|two|quad|four|eight)\s+)?"
    r"(?P<name>.+?)(?:(?:\s+[x×*]\s*|\s*[×*]\s*)(?P<post>\d+)|\s*\((?P<paren>\d+)\))?\s*(?:gpus?|cards?)?$"
)
_WORD_COUNTS = {"single": 1, "one": 1, "dual": 2, "two": 2, "quad": 4, "four": 4, "eight": 8}
_ACCELERATE_STRATEGY = {"MULTI_GPU": "ddp", "DEEPSPEED": "deepspeed", "FSDP": "fsdp", "NO": None}


def _version(value: str) -> str | None:
    # quotes and Markdown emphasis users wrap a template's answer in: **'1.6.0+cu101'**
    value = value.strip().strip("`'\"*_ ")
    m = _VERSION.match(value)
    return m.group(1) if m else None


def _bool(value: str) -> bool | None:
    word = value.strip().strip("`'\"*_ ").split(" ")[0].lower() if value.strip() else ""
    return _BOOL.get(word)


def _size_gib(value: str) -> int | None:
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*(GB|GiB|MB|MiB|TB|TiB)\b", value)
    if not m:
        return None
    factor = {"MB": 2**20, "MIB": 2**20, "GB": 2**30, "GIB": 2**30, "TB": 2**40, "TIB": 2**40}[m.group(2).upper()]
    return int(float(m.group(1)) * factor)


def _platform(text: str) -> str | None:
    low = text.lower()
    if low.startswith("linux") or any(
        w in low
        for w in ("ubuntu", "debian", "centos", "red hat", "rhel", "fedora", "rocky", "almalinux", "suse", "arch linux")
    ):
        return "linux"
    if "windows" in low or low.startswith("win"):
        return "win32"
    if low.startswith(("darwin", "macos", "mac os", "osx")):
        return "darwin"
    return None


@dataclass
class _Found:
    host: dict[str, Any] = field(default_factory=dict)
    torch: dict[str, Any] = field(default_factory=dict)
    driver: dict[str, Any] = field(default_factory=dict)
    launcher: dict[str, Any] = field(default_factory=dict)
    packages: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    devices: dict[int, dict[str, Any]] = field(default_factory=dict)
    gpu_count: int | None = None
    named_gpus: list[str] = field(default_factory=list)  # models without indices (free-form)
    links: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    task: str | None = None  # the label of the line being read (srun -l)
    first_task: str | None = None
    task_devices: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)  # other tasks' GPUs
    screenshot_platform: str | None = None  # weaker than any statement: applied last
    node_products: list[str] = field(default_factory=list)  # GPU models of nodes' labels, in order

    def set(self, section: dict[str, Any], key: str, value: Any) -> None:
        """First statement wins: reports repeat facts, and the first is the most specific."""
        if value is not None and key not in section:
            section[key] = value

    def device(self, index: int, **values: Any) -> None:
        """A device that an enumeration (a list of all GPUs) names."""
        self.first_task = self.first_task or self.task
        own = self.task in (None, self.first_task)
        entry = (self.devices if own else self.task_devices.setdefault(self.task, {})).setdefault(index, {})
        entry["_listed"] = True
        for key, value in values.items():
            if value is not None and key not in entry:
                entry[key] = value

    def package(self, name: str, version: str | None) -> None:
        if version and re.match(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$", name):
            canonical = canonical_package(name)
            self.packages.setdefault(canonical, version)
            if re.fullmatch(r"nvidia-nccl-cu\d+", canonical):
                # pip wheels of torch load the NCCL of this package
                self.set(self.torch, "nccl", version)


class _Parser:
    def __init__(self) -> None:
        self.found = _Found()
        self.section = ""  # Lightning's "* CUDA:" headings
        self.soft_section = False  # a section that a blank line ends
        self.list_key: str | None = None  # a "- GPU:" key whose items follow
        self.topo_cols: list[int] | None = None
        self.smi_index: int | None = None
        self.smi_devices: list[int] = []
        self.in_processes = False
        self.saw_processes = False
        self.in_conda = False  # rows of a `conda list` table follow its header
        self.nccl_tests_host: str | None = None
        self.env_entry: str | None = None  # a manifest's "- name: X" whose "value:" line follows

    def line(self, raw: str) -> None:
        raw = _QUOTE.sub("", raw.replace("\t", "    ")).rstrip()
        label = _TASK_LABEL.match(raw.strip())
        self.found.task = label.group("task") if label else None
        if label:
            raw = raw.strip()[label.end() :]
        if not raw.strip():
            self.list_key = None
            if self.soft_section:
                self.section, self.soft_section = "", False
            return
        if _FENCE_OR_TAG.match(raw):
            return
        # a table's border starts "+---" or "+===" (nvidia-smi); "+ nccl: 2.2.13" is a bullet
        if raw.lstrip().startswith(("|", "+-", "+=")) or _SMI_PROCESS_ROW.match(raw.strip()):
            self.smi(raw.strip())
            return
        self.in_processes = False
        stripped = raw.strip()
        for handler in (self.tables, self.simple_lines):
            if handler(stripped):
                return
        bullet = _BULLET.match(raw)
        body = raw[bullet.end() :].strip() if bullet else stripped
        is_bullet = bool(bullet and raw[: bullet.end()].strip(" >#"))
        heading = re.match(r"^\*\s+(?P<name>[A-Za-z][\w ]*):\s*$", stripped)
        if heading:
            self.section, self.list_key = heading.group("name").strip().lower(), None
            self.soft_section = False
            return
        if self.list_key and is_bullet and ":" not in body:
            self.list_item(body)
            return
        dotted = _DOTTED.match(stripped)
        if dotted:
            self.key_value(dotted.group("key"), dotted.group("value"))
            return
        kv = _KEY_VALUE.match(body)
        if kv:
            self.key_value(kv.group("key"), kv.group("value"))
        elif _GPU_WORDS.search(body):
            # a sentence that names one model ("使用两台NVIDIA A100-SXM4-80GB GPU"); one that names
            # two is a comparison ("with 3090 everything is fine"), not this job's hardware, unless
            # it joins them ("RTX 3090 + RTX 2080 Ti", "a Titan Xp next to the 4090", 混插). A bare
            # model number needs a word for GPUs around it, or a second model it is joined to
            # ("a6000 + 3090 in the same box"), one of them more than a letter and a number
            from probes.tables import shipped

            named = shipped().models_in(body)
            together = len(named) > 1 and bool(_GPUS_TOGETHER.search(body))
            plain = together and not all(re.fullmatch(r"[A-Z]\d{1,3}", n) for n in named)
            if (len(named) > 1 and not together) or not (plain or _GPU_CONTEXT.search(body)):
                named = ()
            self.found.named_gpus.extend(n for n in named if n not in self.found.named_gpus)

    # --- whole-line formats ---------------------------------------------------------------

    def tables(self, line: str) -> bool:
        f = self.found
        m = _P2P_DEVICE.match(line)
        if m:
            f.device(
                int(m.group("index")),
                name=m.group("name").strip(),
                pci_bus_id=f"{int(m.group('domain'), 16):08X}:{int(m.group('bus'), 16):02X}:00.0"
                if _is_hex(m.group("domain")) and _is_hex(m.group("bus"))
                else None,
            )
            return True
        m = _P2P_ACCESS.match(line)
        if m:
            a, b = int(m.group("a")), int(m.group("b"))
            status = "ok" if m.group("can") == "CAN" else "not_supported"
            link = f.links.setdefault((min(a, b), max(a, b)), {})
            # either direction failing makes the pair unusable for P2P
            if link.get("p2p_read") != "not_supported":
                link["p2p_read"] = link["p2p_write"] = status
            return True
        m = _NCCL_TESTS_RANK.match(line)
        if m:
            host = m.group("host")
            self.nccl_tests_host = self.nccl_tests_host or host
            if host == self.nccl_tests_host:
                f.device(int(m.group("index")), name=m.group("name"))
            return True
        header = _TOPO_HEADER.match(line)
        if header and re.match(r"^GPU0\s+GPU1\b", line):
            self.topo_cols = [int(c[3:]) for c in header.group("cols").split()]
            return True
        m = _P2P_ROW.match(line)
        if m and self.topo_cols is not None:
            a = int(m.group("index"))
            for b, cell in zip(self.topo_cols, m.group("cells").split(), strict=False):
                if a != b and cell != "X":
                    link = f.links.setdefault((min(a, b), max(a, b)), {})
                    if link.get("p2p_read") in (None, "ok"):
                        link["p2p_read"] = link["p2p_write"] = _P2P_STATUS[cell]
            return True
        m = _TOPO_ROW.match(line)
        if m and self.topo_cols is not None:
            a = int(m.group("index"))
            for b, cell in zip(self.topo_cols, m.group("cells").split(), strict=False):
                if a < b and cell != "X":
                    link = f.links.setdefault((a, b), {})
                    nv = re.match(r"NV(\d+)", cell)
                    link.setdefault("common_ancestor", "NVLINK" if nv else ("PHB" if cell == "SOC" else cell))
                    if nv:
                        link.setdefault("nvlinks", int(nv.group(1)))
            return True
        return False

    def simple_lines(self, line: str) -> bool:
        f = self.found
        for gfd in _GFD_PRODUCT.finditer(line):
            model = gfd.group("model").replace("-", " ", 1)
            if model not in f.node_products:
                f.node_products.append(model)
        for pattern, platform in _SCREENSHOT_PLATFORM:
            if f.screenshot_platform is None and pattern.search(line):
                f.screenshot_platform = platform
        banner = _ULTRALYTICS_TORCH.search(line)
        if banner:
            if banner.group("python"):
                f.set(f.host, "python", banner.group("python"))
            _torch_version(self, banner.group("torch"), False)
        gpus = list(_ULTRALYTICS_GPU.finditer(line))
        for m in gpus:
            f.device(int(m.group("index")), name=m.group("name").strip(), memory_total_mib=float(m.group("mib")))
        if banner or gpus:
            return True
        listed = list(_GPU_IN_LIST.finditer(line.strip().lstrip("-*• ")))
        if len(listed) > 1 and listed[0].start() == 0:
            for m in listed:
                f.device(int(m.group("index")), name=m.group("name").strip())
            return True
        m = _GPU_LINE.match(line)
        if m:
            f.device(int(m.group("index")), name=m.group("name").strip(), uuid=m.group("uuid"))
            return True
        m = _PIP_LINE.match(line)
        if m:
            rest = m.group("rest").strip()
            if m.group("tool").startswith("pip"):
                freeze = _FREEZE.match(rest)
                if freeze:
                    f.package(freeze.group("name"), freeze.group("version"))
            else:
                self.conda_row(rest.split())
            return True
        if _CONDA_HEADER.match(line):
            self.in_conda = True
            return True
        if self.in_conda:
            parts = line.split()
            if 2 <= len(parts) <= 4 and _version(parts[1]) == parts[1]:
                self.conda_row(parts)
                return True
            self.in_conda = False
        m = _FREEZE.match(line)
        if m:
            f.package(m.group("name"), m.group("version"))
            return True
        m = _NAME_VERSION.match(line)
        if m and canonical_package(m.group("name")) in _TRACKED:
            f.package(m.group("name"), m.group("version"))
            return True
        pending, self.env_entry = self.env_entry, None
        value = _ENV_ENTRY_VALUE.match(line) if pending else None
        code = _ENV_PYTHON.search(line)
        if code and allowed(name := code.group("name") or code.group("key")):
            f.env.setdefault(name, redact_value(name, code.group("value")))
            return True
        m = _ENV_LINE.match(line) or _ENV_ENTRY_FLOW.match(line)
        if value or (m and allowed(m.group("name"))):
            name, text = (pending, value.group("value")) if value else (m.group("name"), m.group("value"))
            f.env.setdefault(name, redact_value(name, text.strip("'\"")))
            return True
        m = _ENV_ENTRY_NAME.match(line)
        if m and allowed(m.group("name")):
            self.env_entry = m.group("name")
            return True
        return False

    def conda_row(self, parts: list[str]) -> None:
        """A `conda list` row: name, version, build string, channel."""
        f = self.found
        if len(parts) < 2 or not _version(parts[1]):
            return
        name, version, build = parts[0], parts[1], parts[2] if len(parts) > 2 else ""
        # conda's "pytorch" is torch; the pip name is what rules use
        f.package("torch" if name == "pytorch" else name, version)
        if name in ("pytorch", "pytorch-mutex", "_pytorch_select"):
            # the build string says which variant was installed: py3.9_cuda11.3_cudnn8.2.0_0, cpu_0
            cuda = re.search(r"(?:^|_)cuda(\d+)\.?(\d)", build)
            if cuda:
                f.set(f.torch, "cuda_build", True)
                f.set(f.torch, "cuda", f"{int(cuda.group(1))}.{cuda.group(2)}")
            elif re.search(r"(?:^|_)cpu(?:_|$)", build):
                f.set(f.torch, "cuda_build", False)

    def smi(self, line: str) -> None:
        f = self.found
        m = _SMI_HEADER.search(line)
        if m:
            f.set(f.driver, "version", m.group("driver"))
            if m.group("cuda") != "N/A":
                f.set(f.driver, "cuda_version", m.group("cuda"))
            return
        if "Processes:" in line:
            self.in_processes = self.saw_processes = True
            return
        # rows pasted without the header say nothing of the GPUs they leave out (saw_processes
        # stays as the header set it: only a whole table marks the other GPUs idle)
        m = (_SMI_PROCESS.match(line) if self.in_processes else None) or _SMI_PROCESS_ROW.match(line)
        if m or self.in_processes:
            if m:
                gpu = int(m.group("gpu"))
                entry = f.devices.setdefault(gpu, {})
                procs = entry.setdefault("processes", [])
                mem = m.group("mem")
                procs.append(
                    GpuProcess(
                        pid=int(m.group("pid")),
                        used_memory_mib=float(mem) if mem else None,
                        cmdline=m.group("name").strip(),
                    )
                )
            return
        m = _SMI_ROW.match(line)
        if m:
            index = int(m.group("index"))
            self.smi_index = index
            self.smi_devices.append(index)
            ecc = m.group("ecc")
            f.device(
                index,
                name=m.group("name").rstrip(". ").strip() or None,
                persistence_mode=m.group("persist") == "On",
                pci_bus_id=m.group("bus"),
                ecc_errors=int(ecc) if ecc.isdigit() else None,
            )
            return
        m = _SMI_USAGE.match(line)
        if m and self.smi_index is not None:
            f.device(
                self.smi_index,
                memory_used_mib=float(m.group("used")),
                memory_total_mib=float(m.group("total")),
                compute_mode=m.group("mode").strip(),
            )
            return
        m = _SMI_MIG.match(line)
        if m and self.smi_index is not None and m.group("mig") != "N/A":
            f.device(self.smi_index, mig_mode=m.group("mig") == "Enabled")
            self.smi_index = None

    # --- key: value -------------------------------------------------------------------------

    def list_item(self, item: str) -> None:
        if self.list_key == "gpu":
            name = item.strip().strip("`")
            if _GPU_WORDS.search(name):
                index = len([d for d in self.found.devices.values() if d.get("_listed")])
                self.found.device(index, name=name)

    def key_value(self, key: str, value: str) -> None:
        f = self.found
        key_norm = _EXAMPLE.sub("", key).replace("`", "").strip(" #*-").lower()
        key_norm = re.sub(r"\s+", " ", key_norm)
        gpu_flag = "(gpu?)" in key_norm
        # "(GPU?)" and "(PyTorch)" qualify the key; "(TensorFlow)" names another library
        key_norm = re.sub(r"\s*\((?:gpu\?|pytorch|torch)\)\s*$", "", key_norm).strip()
        value = value.strip()
        self.list_key = None
        if not value:
            if key_norm in ("gpu", "gpus"):
                self.list_key = "gpu"
            elif re.search(r"version|package|librar|dependenc", key_norm) and not self.section:
                # "Library versions:" followed by "name: version" lines, up to a blank line
                self.section, self.soft_section = "packages", True
            return
        if _NOT_KNOWN.match(value):
            if key_norm == "cuda used to build pytorch" and value.lower() == "none":
                f.set(f.torch, "cuda_build", False)
            return
        section = self.section
        handler = _KEYS.get(key_norm)
        if section in ("packages", "lightning") and handler is None:
            f.package(key_norm.replace(" ", "-"), _version(value))
            return
        if section == "cuda" and key_norm == "version":
            f.set(f.torch, "cuda", _version(value))
            f.set(f.torch, "cuda_build", True)
            return
        if section == "cuda" and key_norm == "available":
            f.set(f.torch, "cuda_available", _bool(value))
            return
        if section == "system" and key_norm in ("version", "architecture", "processor"):
            return
        if section == "system" and key_norm == "release":
            f.set(f.host, "kernel", value)
            return
        if handler is not None:
            handler(self, value, gpu_flag)
            return
        m = re.match(r"^([A-Za-z][\w.-]*) version$", key_norm)
        if m and m.group(1) not in ("os", "cuda", "cudnn", "gcc", "clang", "cmake", "libc", "nvcc", "driver"):
            f.package(m.group(1), _version(value))


def _is_hex(text: str) -> bool:
    return bool(re.fullmatch(r"[0-9A-Fa-f]+", text))


# --- the known keys ---------------------------------------------------------------------------


def _torch_version(p: _Parser, value: str, gpu_flag: bool) -> None:
    f = p.found
    version = _version(value)
    if not version:
        return
    f.set(f.torch, "version", version)
    f.package("torch", version)
    local = re.search(r"\+cu(\d+?)(\d)$", version)
    if local:
        f.set(f.torch, "cuda", f"{int(local.group(1))}.{local.group(2)}")
        f.set(f.torch, "cuda_build", True)
    elif version.endswith("+cpu"):
        f.set(f.torch, "cuda_build", False)
    if gpu_flag:
        m = re.search(r"\((True|False)\)", value)
        if m:
            f.set(f.torch, "cuda_available", m.group(1) == "True")


def _python(p: _Parser, value: str, _: bool) -> None:
    p.found.set(p.found.host, "python", _version(value))


def _os(p: _Parser, value: str, _: bool) -> None:
    f = p.found
    if _platform(value) or p.section == "system":
        f.set(f.host, "os", value)
        f.set(f.host, "platform", _platform(value))


def _python_platform(p: _Parser, value: str, _: bool) -> None:
    f = p.found
    platform = _platform(value)
    if platform is None:
        return
    f.set(f.host, "platform", platform)
    m = re.match(r"(?i)linux-(?P<kernel>\d[^-]*(?:-[^-]*?)*?)-(?:x86_64|aarch64|ppc64le|arm64)", value)
    if m:
        f.set(f.host, "kernel", m.group("kernel"))


def _cuda_available(p: _Parser, value: str, _: bool) -> None:
    p.found.set(p.found.torch, "cuda_available", _bool(value))


def _cuda_build(p: _Parser, value: str, _: bool) -> None:
    f = p.found
    version = _version(value)
    if version:
        f.set(f.torch, "cuda", version)
        f.set(f.torch, "cuda_build", True)


def _hip(p: _Parser, value: str, _: bool) -> None:
    p.found.set(p.found.torch, "hip", _version(value))


def _driver(p: _Parser, value: str, _: bool) -> None:
    p.found.set(p.found.driver, "version", _version(value))


def _gpus(p: _Parser, value: str, _: bool) -> None:
    """A free-form GPU description: "4x A100", "2 x RTX 3090, 1 x RTX 2080", "Tesla V100"."""
    f = p.found
    total = 0
    counted = True
    names: list[str] = []
    m = _GPU_LINE.match(value)
    if m:
        f.device(int(m.group("index")), name=m.group("name").strip(), uuid=m.group("uuid"))
        return
    for part in re.split(r"\s*(?:,|;|\+|&|\band\b)\s*", value):
        part = part.strip().strip("`")
        if not part or not _GPU_WORDS.search(part):
            continue
        c = _GPU_COUNT.match(part)
        if not c:
            continue
        count_text = c.group("pre") or c.group("post") or c.group("paren")
        count = int(count_text) if count_text else _WORD_COUNTS.get((c.group("word") or "").lower())
        name = c.group("name").strip()
        if not name or not _GPU_WORDS.search(name) or (count is not None and not 0 < count <= 1024):
            continue
        if count is None:
            counted = False
            count = 1
        names.extend([name] * count)
        total += count
    if names:
        f.named_gpus.extend(names)
        if counted and f.gpu_count is None:
            f.gpu_count = total


def _cpus(p: _Parser, value: str, _: bool) -> None:
    if value.strip().isdigit():
        p.found.set(p.found.host, "cpu_count", int(value.strip()))


def _attached(p: _Parser, value: str, _: bool) -> None:
    if value.strip().isdigit() and p.found.gpu_count is None:
        p.found.gpu_count = int(value.strip())


def _ram(p: _Parser, value: str, _: bool) -> None:
    p.found.set(p.found.host, "memory_total_bytes", _size_gib(value))


def _shm(p: _Parser, value: str, _: bool) -> None:
    p.found.set(p.found.host, "shm_total_bytes", _size_gib(value))


def _deepspeed_info(p: _Parser, value: str, _: bool) -> None:
    p.found.package("deepspeed", _version(value))


def _nccl(p: _Parser, value: str, _: bool) -> None:
    # "- NCCL version: 2.18.1" / "+ nccl: 2.2.13": the release the reporter says the job loads;
    # only a full x.y.z, since "2.18" alone does not say which patch release (min_nccl compares them)
    version = _version(value)
    if version and re.fullmatch(r"\d+\.\d+\.\d+(?:[+-]\S*)?", version):
        p.found.set(p.found.torch, "nccl", version.split("+")[0])


def _lightning(p: _Parser, value: str, _: bool) -> None:
    p.found.package("lightning", _version(value))


def _pytorch_lightning(p: _Parser, value: str, _: bool) -> None:
    p.found.package("pytorch-lightning", _version(value))


def _distributed_type(p: _Parser, value: str, _: bool) -> None:
    kind = value.strip().strip("'\"").upper()
    if kind in _ACCELERATE_STRATEGY:
        p.found.set(p.found.launcher, "strategy", _ACCELERATE_STRATEGY[kind])


def _num_processes(p: _Parser, value: str, _: bool) -> None:
    if value.strip().isdigit():
        p.found.set(p.found.launcher, "world_size", int(value.strip()))


def _num_machines(p: _Parser, value: str, _: bool) -> None:
    if value.strip().isdigit():
        p.found.set(p.found.launcher, "nnodes", int(value.strip()))


_KEYS = {
    **dict.fromkeys(
        ["pytorch version", "torch version", "pytorch", "torch", "pytorch_version", "torch_version"],
        _torch_version,
    ),
    **dict.fromkeys(["python version", "python"], _python),
    **dict.fromkeys(["os", "operating system"], _os),
    **dict.fromkeys(["python platform", "platform"], _python_platform),
    **dict.fromkeys(["is cuda available", "cuda available"], _cuda_available),
    "cuda used to build pytorch": _cuda_build,
    "torch cuda version": _cuda_build,
    "rocm used to build pytorch": _hip,
    **dict.fromkeys(["nvidia driver version", "driver version", "nvidia driver"], _driver),
    **dict.fromkeys(
        [
            "gpu models and configuration",
            "gpu models",
            "gpu model",
            "gpu type",
            "gpu",
            "gpus",
            "gpu model and configuration",
        ],
        _gpus,
    ),
    "cpu(s)": _cpus,
    "product name": _gpus,
    "attached gpus": _attached,
    "system ram": _ram,
    "shared memory size": _shm,
    "shared memory (/dev/shm) size": _shm,
    "deepspeed info": _deepspeed_info,
    **dict.fromkeys(["nccl", "nccl version", "nccl_version"], _nccl),
    **dict.fromkeys(["lightning version", "lightning"], _lightning),
    **dict.fromkeys(
        [
            "pytorch lightning version",
            "pytorch_lightning version",
            "pytorch-lightning version",
            "pytorch lightning",
            "pytorch_lightning",
            "pytorch-lightning",
            "pl version",
        ],
        _pytorch_lightning,
    ),
    "distributed_type": _distributed_type,
    "num_processes": _num_processes,
    "num_machines": _num_machines,
}


# --- assembling the Facts ---------------------------------------------------------------------


def _gpu_section(f: _Found) -> dict[str, Any]:
    devices: list[Gpu] = []
    listed = [i for i, d in f.devices.items() if d.get("_listed")]
    if f.devices:
        # the other tasks' GPUs are the job's too (the count stays one node's); a node is named
        # only where there are several
        nodes = [(f.first_task if f.task_devices else None, f.devices), *f.task_devices.items()]
        for node, entries in nodes:
            for index in sorted(entries):
                values = {k: v for k, v in entries[index].items() if not k.startswith("_")}
                devices.append(Gpu(index=index, node=node, **values))
    elif len(f.node_products) > 1:
        # each label is a node's own GPU model: as many nodes as models, their GPU 0 stands for each
        devices = [Gpu(index=0, node=f"label {i}", name=name) for i, name in enumerate(f.node_products)]
    elif f.named_gpus or f.node_products:
        devices = [Gpu(index=i, name=name) for i, name in enumerate(f.node_products or f.named_gpus)]
    out: dict[str, Any] = {}
    if devices:
        out["devices"] = devices
    # a process table names only the GPUs that have processes: it is no count
    if listed:
        out["count"] = len(listed)
    elif f.gpu_count is not None:
        out["count"] = f.gpu_count
    if f.links:
        out["topology"] = [GpuLink(a=a, b=b, **values) for (a, b), values in sorted(f.links.items())]
    visible = f.env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        out["visible"] = [v.strip() for v in visible.split(",") if v.strip()]
    return out


def parse_report(text: str, name: str = "report") -> Facts:
    """A partial Facts from a pasted environment report; unknown text is ignored."""
    parser = _Parser()
    for raw in str(text).splitlines():
        parser.line(raw[:4096])
    f = parser.found
    if f.screenshot_platform:
        f.set(f.host, "platform", f.screenshot_platform)
    if parser.saw_processes:
        # a GPU of the table with no row in its process list runs no process
        for index in parser.smi_devices:
            f.devices.setdefault(index, {}).setdefault("processes", [])
    facts = Facts(inputs=[f"report:{name}"])
    sections = {
        "host": f.host,
        "torch": f.torch,
        "driver": f.driver,
        "launcher": f.launcher,
        "gpus": _gpu_section(f),
    }
    for section, values in sections.items():
        if values:
            setattr(facts, section, type(getattr(facts, section))(source="report", **values))
    if f.packages:
        facts.packages = type(facts.packages)(source="report", values=f.packages, complete=False)
    if f.env:
        facts.env = type(facts.env)(source="report", values=f.env, complete=False)
    return facts
