"""Offline evidence: pasted environment reports and logs combined into one ``Facts``.

``offline_facts(reports, logs)`` parses every report (``probes.report``), reads every log
(``probes.log``; the retained lines of a log are also read as a report, since users paste
nvidia-smi tables and nccl-tests headers into their logs) and merges them: for a plain field the first input that states it wins
(reports before logs, in the order given); keyed sections (packages, env) merge their
names; the log section concatenates lines and signatures, each tagged with its source.

Beyond what each reader finds, the texts are searched for what the job itself stated:
the launcher and its arguments (``torchrun --nproc_per_node=4``, ``srun``, ``mpirun -np``,
``accelerate launch``, ``notebook_launcher(..., num_processes=2)``), the requested
strategy and devices (``Trainer(strategy="ddp", devices=4)``, ``--gpus 2``),
``CUDA_VISIBLE_DEVICES=...`` assignments, notebooks (``ipykernel``, ``notebook_launcher``),
Lightning's banners (world size, visible devices, ``GPU available: False``), and NCCL's own ``NCCL_X set by
environment`` and ``NCCL version`` lines.

A report that itself contains error signatures (a warning pasted into the environment
section) is also read as a log, so those signatures count; a report without any leaves
the log section to the logs, so log evidence stays "unknown" when no log was given.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from probes.facts import Facts, Gpu, Log, Section, Skipped, Source
from probes.hang import pasted_stacks
from probes.log import LogError, log_from_text, read_log
from probes.logfacts import structure
from probes.patterns import compile as _linear  # the texts are untrusted: linear-time matching
from probes.report import parse_report

_LAUNCH = [
    (_linear(r"\btorchrun\b|torch\.distributed\.(?:launch|run)\b|\bpython -m torch\.distributed"), "torchrun"),
    (_linear(r"(?:^|[\s$`])srun\s"), "slurm"),
    (_linear(r"\b(?:mpirun|mpiexec)\b"), "mpirun"),
    (_linear(r"\baccelerate launch\b|\bnotebook_launcher\s*\("), "accelerate"),
    (_linear(r"(?:^|[\s$`])deepspeed\s+(?:--\w|\S+\.py)"), "deepspeed"),
]
_INT_ARGS = {
    "local_world_size": _linear(r"--nproc[_-]per[_-]node[= ]+(\d+)"),
    "nnodes": _linear(
        r"--(?:nnodes?|num[_-]nodes)[= ]+(\d+)(?:[^\d:]|$)|\bnum_nodes\s*=\s*(\d+)|\b(?:NNODES|NUM_NODES|N_NODES)=(\d+)\b"
        # a config file's key (a Trainer's num_nodes, accelerate's num_machines), small as node
        # counts are: a graph's num_nodes runs to thousands
        r"|\b(?:num_nodes|num_machines):\s*([1-9]\d?)\b(?:\s*(?:#|,|\)|$)|\s+(?:but|and|while|though|although|even|yet)\b)"
    ),
    "node_rank": _linear(r"--node[_-]rank[= ]+(\d+)"),
    "master_port": _linear(r"--master[_-]port[= ]+(\d+)"),
    "world_size": _linear(r"\b(?:mpirun|mpiexec)\b[^\n]*?\s-(?:np|n)\s+(\d+)|--num[_-]processes[= ]+(\d+)"),
    "slurm_ntasks_per_node": _linear(r"--ntasks-per-node[= ]+(\d+)"),
    "slurm_ntasks": _linear(r"(?:--ntasks|\bsrun\b[^\n]*?\s-n)[= ]+(\d+)\b"),
    "slurm_nnodes": _linear(r"(?:#SBATCH|\bsbatch\b|\bsrun\b|\bsalloc\b)[^\n]*?(?:--nodes[= ]+|\s-N\s*)(\d+)\b"),
}
_STRATEGY = [
    _linear(r"""\bstrategy\s*=\s*["'](?P<s>\w+)["']"""),
    _linear(r"--strategy[= ]+[\"']?(?P<s>\w+)"),
    _linear(r"""\b(?:accelerator|distributed_backend)\s*=\s*["'](?P<s>ddp\w*|dp|ddp2|horovod)["']"""),
    _linear(r"\bstrategy\s*=\s*(?P<cls>DDP|FSDP|DeepSpeed|DDPSpawn|SingleDevice)Strategy\("),
]
_STRATEGY_CLASS = {
    "DDP": "ddp",
    "FSDP": "fsdp",
    "DeepSpeed": "deepspeed",
    "DDPSpawn": "ddp_spawn",
    "SingleDevice": "single_device",
}
_DEVICES = [
    _linear(r"\b(?:devices|gpus|num_gpus|n_gpus)\s*=\s*(?P<n>\d+)\b"),
    _linear(r"--(?:devices|gpus|num[_-]gpus)[= ]+(?P<n>\d+)\b(?![,\d])"),
    _linear(r"""\b(?:devices|gpus)\s*=\s*\[(?P<list>[\d, ]+)\]"""),
    _linear(r"""(?:\b(?:devices|gpus)\s*=\s*|--(?:devices|gpus)[= ]+)["'](?P<list>\d+(?:\s*,\s*\d+)+)["']"""),
    _linear(r"\bnum_processes\s*=\s*(?P<n>\d+)\b"),
]
_MASTER_ADDR = _linear(
    r"(?i)(?:--master[_-]addr[= ]+|\bMASTER_ADDR\s*=\s*|\bmaster_addr\s*(?:=|:|设置成|设置为|设为|set to|is)\s*"
    # the store's host given as a TCP init method (init_process_group's, a --dist-url)
    r"|\b(?:init_method|dist[_-]url)\b[=: \"'f]{1,4}tcp://)"
    r"[\"']?(?P<a>[A-Za-z0-9][\w.-]*)"
)
_VISIBLE = _linear(r"""\bCUDA_VISIBLE_DEVICES\s*=\s*["']?(?P<v>\d+(?:\s*,\s*\d+)*)["']?(?:\s|$|;)""")
# Lightning's banner: "GPU available: True (cuda), used: True"
_GPU_AVAILABLE = _linear(r"^GPU available: (True|False)\b", multiline=True)
# Lightning told the same way ("Lightning 2.1.0", "pytorch_lightning==1.9.4", "PyTorch Lightning 1.8")
_LIGHTNING_STATED = _linear(
    r"(?i)(?:^|[^\w.>=<-])(?P<name>pytorch[ _-]lightning|lightning)(?:\s*(?:version|版本)\s*)?"
    r"(?:\s*(?:==?|:|：|是|为)\s*|\s+v?|v)(?P<v>\d+\.\d+(?:\.\d+)?)(?:[^\w.]|\.(?:\W|$)|$)"
)
# the driver and torch's CUDA told in prose ("my driver is 470.82", "驱动版本 535", "built with cu121")
_DRIVER_STATED = _linear(
    r"(?i)(?:\b(?:nvidia|gpu)?\s*driver|驱动)(?:\s*(?:version|版本))?\s*(?:is|=|:|：|是|为|of)?\s*v?"
    r"(?P<v>[3-9]\d{2}(?:\.\d{1,3}){0,2})(?:[^\w.]|$)"
)
_CUDA_TAG_STATED = _linear(r"(?i)(?:\b|\+)cu(?P<major>1[0-3]|9)(?P<minor>\d)\b")
# an image pasted in a Markdown report (a screenshot of the error), or an image link
_IMAGE = _linear(
    r"!\[[^\]\n]*\]\(\s*\S+|<img\s[^>\n]*src=|\bhttps?://\S+\.(?:png|jpe?g|gif|webp)\b|user-images\.githubusercontent\.com/"
)
_INTERACTIVE = _linear(
    r"ipykernel|<ipython-input-|/tmp/ipykernel_|google\.colab|\bnotebook_launcher\b|"
    r"(?i:\bjupyter (?:notebook|lab)\b|\bin (?:a )?(?:jupyter|colab)\b)"
)


def offline_facts(
    reports: Sequence[tuple[str, str]] = (),
    logs: Sequence[tuple[str, Any]] = (),
    keep: Iterable[str] = (),
) -> Facts:
    """One Facts from ``(name, text)`` reports and ``(name, source)`` logs (a source as
    ``probes.log.read_log`` takes it). Raises ``probes.log.LogError`` for an unreadable
    or binary log; never on the content of a report. ``keep``: literals whose lines a long
    log retains (``probes.log.read_log``)."""
    facts = Facts()
    texts: list[str] = []
    log_parts: list[Log] = []
    stated_torch: list[str] = []  # torch releases stated in the reports' and logs' own words
    for name, text in reports:
        facts.inputs.append(f"report:{name}")
        _merge(facts, parse_report(text, name))
        texts.append(text)
        try:
            from_report = log_from_text(text, f"report:{name}")
        except LogError:
            continue  # control characters throughout: nothing a log reader can use
        stated_torch += _torch_stated(from_report)
        # the torch release every environment report states is the report parser's own field:
        # it alone does not make a report a log
        if any(sig.id != "torch_release_stated" for sig in from_report.signatures or []):
            log_parts.append(from_report)
    for name, source in logs:
        facts.inputs.append(f"log:{name}")
        log = read_log(source, name, keep)
        log_parts.append(log)
        # tables pasted into a log (nvidia-smi, nccl-tests headers) are facts too, from the log
        _merge(facts, _relabelled(parse_report("\n".join(line.text for line in log.lines or []), name), "log"))
    if logs or log_parts:
        facts.log = structure(_merged_logs(log_parts), log_from_text)
    lines = [line.text for line in facts.log.lines or []]
    _stated(facts, texts + ["\n".join(lines)], stated_torch + _torch_stated(facts.log))
    _from_signatures(facts)
    # py-spy dumps pasted in the log show where the hung ranks wait, as `diagnose hang` would
    stacks = pasted_stacks(lines)
    if stacks:
        _set(facts.hang, "ranks", stacks)
    # a report's lines can reach the log too: count each image once
    images = len(
        {m.group(0) for text in [*texts, *(line.text for line in facts.log.lines or [])] for m in _IMAGE.finditer(text)}
    )
    if images:  # the error is often only in a screenshot: say so rather than let it pass unread
        facts.skipped.append(
            Skipped(
                what=f"{images} image{'s' if images > 1 else ''} in the report",
                reason="images are not read: paste the error as text",
            )
        )
    facts.skipped.append(Skipped(what="live probes", reason="offline: diagnosing pasted reports and logs only"))
    facts.skipped.append(Skipped(what="micro-tests", reason="offline: nothing is run on the reporter's machine"))
    return facts


# --- merging ----------------------------------------------------------------------------------


def _merge(into: Facts, new: Facts) -> None:
    for name in ("host", "torch", "gpus", "driver", "launcher"):
        _merge_section(getattr(into, name), getattr(new, name))
    for name in ("packages", "env"):
        target, source = getattr(into, name), getattr(new, name)
        if source.values:
            for key, value in source.values.items():
                target.values.setdefault(key, value)
            target.source = target.source or source.source


def _relabelled(facts: Facts, source: Source) -> Facts:
    for name in ("host", "torch", "gpus", "driver", "launcher", "packages", "env"):
        section = getattr(facts, name)
        if section.source is not None:
            section.source = source
    return facts


def _merge_section(target: Section, source: Section) -> None:
    if source.source is None:
        return
    for field_name in type(source).model_fields:
        if field_name in ("source", "unavailable"):
            continue
        value = getattr(source, field_name)
        if value is not None and getattr(target, field_name) is None:
            setattr(target, field_name, value)
    target.source = target.source or source.source


def _merged_logs(parts: Iterable[Log]) -> Log:
    merged = Log(source="log", lines_read=0, lines=[], signatures=[])
    for part in parts:
        merged.sources.extend(part.sources)
        merged.lines_read = (merged.lines_read or 0) + (part.lines_read or 0)
        merged.lines = [*(merged.lines or []), *(part.lines or [])]
        merged.signatures = [*(merged.signatures or []), *(part.signatures or [])]
    return merged


# --- what the texts state ---------------------------------------------------------------------


def _set(section: Section, field_name: str, value: Any, source: str = "log") -> None:
    if value is not None and getattr(section, field_name) is None:
        setattr(section, field_name, value)
        section.source = section.source or source


def _stated(facts: Facts, texts: list[str], torch_releases: list[str]) -> None:
    launcher, host, gpus = facts.launcher, facts.host, facts.gpus
    for text in texts:
        for pattern, kind in _LAUNCH:
            if pattern.search(text):
                _set(launcher, "kind", kind)
                break
        for field_name, pattern in _INT_ARGS.items():
            m = pattern.search(text)
            if m:
                _set(launcher, field_name, int(next(g for g in m.groups() if g is not None)))
        # a text that names two strategies compares them ("switching from strategy='ddp' to
        # strategy='fsdp'"): which one failed is not said, so neither is taken
        named = {
            (_STRATEGY_CLASS[m.group("cls")] if "cls" in m.groupdict() else m.group("s")).lower()
            for pattern in _STRATEGY
            for m in pattern.finditer(text)
        }
        if len(named) == 1:
            _set(launcher, "strategy", named.pop())
        for pattern in _DEVICES:
            m = pattern.search(text)
            if m:
                groups = m.groupdict()
                count = int(groups["n"]) if groups.get("n") else len(re.findall(r"\d+", groups["list"]))
                _set(launcher, "devices_requested", count)
                break
        m = _MASTER_ADDR.search(text)
        if m and not m.group("a").startswith("$"):
            _set(launcher, "master_addr", m.group("a"))
        m = _VISIBLE.search(text)
        if m:
            visible = [v.strip() for v in m.group("v").split(",")]
            _set(gpus, "visible", visible)
            if facts.env.values.get("CUDA_VISIBLE_DEVICES") is None:
                facts.env.values["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
                facts.env.source = facts.env.source or "log"
        if _INTERACTIVE.search(text):
            _set(host, "interactive", True)
        m = _GPU_AVAILABLE.search(text)
        if m:
            _set(facts.torch, "cuda_available", m.group(1) == "True")
    if launcher.devices_requested is None and launcher.local_world_size is not None:
        _set(launcher, "devices_requested", launcher.local_world_size)
    if facts.torch.version is None:
        stated = next(iter(torch_releases), None)
        if stated:  # read as a report's own line would be, so the CUDA tag counts the same
            _merge(facts, _relabelled(parse_report(f"PyTorch version: {stated}", "stated"), "log"))
    if not {"lightning", "pytorch-lightning"} & set(facts.packages.values):
        m = next((m for text in texts if (m := _LIGHTNING_STATED.search(text))), None)
        if m:
            name = "lightning" if m.group("name").lower() == "lightning" else "pytorch-lightning"
            _merge(facts, _relabelled(parse_report(f"{name}=={m.group('v')}", "stated"), "log"))
    if facts.torch.cuda is None:
        tag = next((m for text in texts if (m := _CUDA_TAG_STATED.search(text))), None)
        if tag:
            _set(facts.torch, "cuda", f"{tag.group('major')}.{tag.group('minor')}")
            if tag.group(0).startswith("+"):  # a wheel's local version ("2.2.2+cu121"): a CUDA build
                _set(facts.torch, "cuda_build", True)
    if facts.driver.version is None:
        driver = next((m.group("v") for text in texts if (m := _DRIVER_STATED.search(text))), None)
        if driver:
            _merge(facts, _relabelled(parse_report(f"Nvidia driver version: {driver}", "stated"), "log"))


def _torch_stated(log: Log) -> list[str]:
    """The torch releases a text states, in order (signature torch_release_stated)."""
    return [version for (version,) in log.stated("torch_release_stated", "version") or [] if version]


def _from_signatures(facts: Facts) -> None:
    for sig in facts.log.signatures or []:
        data = sig.data
        if sig.id in ("lightning_ddp_init", "lightning_all_registered") and "world_size" in data:
            _set(facts.launcher, "world_size", int(data["world_size"]))
        elif sig.id == "lightning_cuda_visible" and data.get("devices", "").strip():
            _set(facts.gpus, "visible", [d.strip() for d in data["devices"].split(",") if d.strip()])
        elif sig.id == "nccl_env" and "var" in data:
            if data["var"] not in facts.env.values:
                facts.env.values[data["var"]] = data.get("value", "")
                facts.env.source = facts.env.source or "log"
        elif sig.id == "nccl_version" and "version" in data:
            _set(facts.torch, "nccl", data["version"].split("+")[0])
        elif (
            sig.id == "cuda_arch_incompatible"
            and "arch" in data
            and not any(d.compute_capability for d in facts.gpus.devices or [])
        ):
            # torch's own warning names the device and its capability: more than a model named in prose
            arch = data["arch"][3:]
            capability = f"{arch[:-1]}.{arch[-1]}" if len(arch) >= 2 else None
            facts.gpus.devices = [Gpu(index=0, name=data.get("gpu"), compute_capability=capability)]
            facts.gpus.source = facts.gpus.source or "log"
