"""probes.tables: the knowledge tables load, cite their sources, reject bad rows, and drive the
derived facts; a new GPU is one row; no rule names a GPU model or a version in a log pattern."""

from __future__ import annotations

import io
import re
import shutil
from pathlib import Path

import pytest

import probes.tables as tables
from diagnose.engine import evaluate
from diagnose.kb import KB, load_kb
from diagnose.kblint import naming_offenders
from probes.facts import Driver, Facts, Gpu, Gpus, Host, TorchBuild
from probes.offline import offline_facts
from probes.signatures import kb_dir
from probes.snapshot import facts_from_dict
from probes.tables import TableError, load_tables

SHIPPED = tables.shipped()


def copy_kb(tmp_path: Path) -> Path:
    root = tmp_path / "kb"
    shutil.copytree(kb_dir() / "tables", root / "tables")
    return root


def test_every_table_loads_and_cites_https_sources():
    assert set(SHIPPED.sources) == {"gpus", "cuda", "torch", "nccl", "packages"}
    for name, sources in SHIPPED.sources.items():
        assert sources and all(s.startswith("https://") for s in sources), name


@pytest.mark.parametrize(
    "file,old,new,expected",
    [
        (
            "gpus.yaml",
            'name: H100, capability: "9.0"',
            'name: H100, capability: "9.9"',
            r"gpus\.yaml:\d+: models\[\d+\]\.capability: no row for compute capability 9\.9",
        ),
        (
            "cuda.yaml",
            'cuda: "12.4", linux: "550.54.14"',
            'cuda: "12.4", linux: "R550"',
            r"cuda\.yaml:\d+: releases\[\d+\]\.linux: not a version: 'R550'",
        ),
        (
            "packages.yaml",
            'torch: ">=2.1"',
            'torch: "newer than 2.1"',
            r"packages\.yaml: requirements\.lightning\[\d+\]\.torch: not a version specifier",
        ),
        (
            "nccl.yaml",
            "sources:\n",
            "sources: []\nunused:\n",
            r"nccl\.yaml:\d*:? ?sources: List should have at least 1 item",
        ),
        (
            "nccl.yaml",
            "archs: [hopper]",
            "archs: [hoper]",
            r"nccl\.yaml:\d+: known_issues\[1\]\.archs: not an architecture of gpus\.yaml: \['hoper'\]",
        ),
    ],
)
def test_a_bad_row_is_one_line_naming_file_and_place(tmp_path, file, old, new, expected):
    root = copy_kb(tmp_path)
    path = root / "tables" / file
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(TableError) as info:
        load_tables(root)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    assert re.search(expected, message), message


def test_a_missing_table_file_names_the_file(tmp_path):
    root = copy_kb(tmp_path)
    (root / "tables" / "torch.yaml").unlink()
    with pytest.raises(TableError, match=r"torch\.yaml: cannot read"):
        load_tables(root)


def test_gpu_names_resolve_to_the_longest_whole_word_row():
    model = SHIPPED.gpu_model
    assert model("NVIDIA GeForce RTX 5070 Ti").name == "GeForce RTX 5070 Ti"
    assert model("NVIDIA GeForce RTX 5070").name == "GeForce RTX 5070"
    assert model("NVIDIA L40S").name == "L40S" and model("NVIDIA L4").name == "L4"
    assert model("NVIDIA A100-SXM4-80GB").name == "A100"
    assert model("4x 4090").name == "GeForce RTX 4090"  # people write GeForce cards by number
    assert model("NVIDIA RTX 4000 Ada Generation").cls == "workstation"
    assert model("Matrox G200") is None


def facts_with(name: str | None, torch: TorchBuild, capability: str | None = None) -> Facts:
    facts = Facts()
    facts.gpus = Gpus(count=2, devices=[Gpu(index=i, name=name, compute_capability=capability) for i in range(2)])
    facts.torch = torch
    return facts


def test_torch_covers_a_gpu_from_its_arch_list_with_binary_compatibility():
    # sm_80 kernels run on 8.6 and 8.9; nothing of major 8 runs on 9.0 without PTX
    for capability, covered in (("8.6", True), ("8.9", True), ("9.0", False)):
        facts = facts_with(None, TorchBuild(version="2.0.1", cuda="11.8", arch_list=["sm_70", "sm_80"]), capability)
        assert facts.torch.supports_gpu_arch is covered, capability
    ptx = facts_with(None, TorchBuild(version="2.0.1", cuda="11.8", arch_list=["sm_80", "compute_80"]), "9.0")
    assert ptx.torch.supports_gpu_arch is True


def test_torch_covers_a_gpu_from_its_cuda_and_release_without_an_arch_list():
    blackwell = "NVIDIA GeForce RTX 5090"
    assert facts_with(blackwell, TorchBuild(version="2.5.1+cu124", cuda="12.4")).torch.supports_gpu_arch is False
    assert facts_with(blackwell, TorchBuild(version="2.7.0+cu128", cuda="12.8")).torch.supports_gpu_arch is True
    # the other direction: a CUDA 12.8 build of torch 2.8 no longer carries Pascal kernels
    pascal = facts_with("NVIDIA GeForce GTX 1080 Ti", TorchBuild(version="2.8.0+cu128", cuda="12.8"))
    assert pascal.torch.supports_gpu_arch is False
    assert facts_with(
        "NVIDIA GeForce GTX 1080 Ti", TorchBuild(version="2.8.0+cu126", cuda="12.6")
    ).torch.supports_gpu_arch
    assert facts_with(None, TorchBuild(version="2.5.1", cuda="12.4")).torch.supports_gpu_arch is None


def test_nccl_facts_come_from_the_build_or_the_release_table():
    facts = facts_with("NVIDIA H100 80GB HBM3", TorchBuild(version="1.13.1+cu117", cuda="11.7"))
    assert facts.torch.bundled_nccl == "2.14.3"
    assert facts.torch.nccl_supports_gpu_arch is False  # Hopper support came in 2.15.1
    facts.torch = TorchBuild(version="2.1.0", nccl="2.18.1")
    assert facts.torch.nccl_supports_gpu_arch is True and facts.torch.nccl_known_issue is None
    facts.torch = TorchBuild(nccl="2.4.2")
    assert "fixed in 2.4.6" in facts.torch.nccl_known_issue
    facts.torch = TorchBuild(nccl="2.15.1")  # the Ring/LL128 hang of 2.15.1 was on H100s
    assert "fixed in 2.15.5" in facts.torch.nccl_known_issue
    assert facts_with("NVIDIA A100-SXM4-80GB", TorchBuild(nccl="2.15.1")).torch.nccl_known_issue is None


def test_an_nccl_release_older_than_the_gpus_is_told_apart_from_an_old_cuda_build():
    # RTX 50xx (sm_120): NCCL 2.25.1 knew Blackwell, 2.26.2 fixed its shared memory on them
    old = facts_with("NVIDIA GeForce RTX 5090", TorchBuild(nccl="2.25.1"))
    assert old.torch.nccl_predates_gpu_arch is True and old.torch.nccl_supports_gpu_arch is False
    new = facts_with("NVIDIA GeForce RTX 5090", TorchBuild(nccl="2.26.2"))
    assert new.torch.nccl_predates_gpu_arch is False and new.torch.nccl_supports_gpu_arch is True
    assert facts_with("NVIDIA B200", TorchBuild(nccl="2.25.1")).torch.nccl_predates_gpu_arch is False
    assert facts_with("NVIDIA GeForce RTX 2080 Ti", TorchBuild(nccl="2.4.2")).torch.nccl_predates_gpu_arch is False
    assert facts_with(None, TorchBuild(nccl="2.4.2")).torch.nccl_predates_gpu_arch is None


def test_driver_against_torch_cuda_counts_minor_version_compatibility():
    def supports(driver: Driver, cuda: str, platform: str = "linux") -> bool | None:
        facts = Facts()
        facts.host, facts.driver, facts.torch = Host(platform=platform), driver, TorchBuild(cuda=cuda)
        return facts.driver.supports_torch_cuda

    assert supports(Driver(version="535.104.05", cuda_version="12.2"), "12.4") is True  # same major
    assert supports(Driver(version="470.82.01", cuda_version="11.4"), "12.1") is False
    assert supports(Driver(version="520.61.05"), "11.8") is True
    assert supports(Driver(version="511.79"), "12.1", "win32") is False
    assert supports(Driver(version="528.02"), "12.1", "win32") is True  # above 527.41, R525 compat
    assert supports(Driver(), "12.1") is None


def test_library_requirements_read_the_installed_torch():
    data = Facts().model_dump()
    data["packages"] = {"values": {"lightning": "2.7.0", "deepspeed": "0.7.3", "torch": "2.5.1"}, "complete": True}
    facts = facts_from_dict(data)
    assert facts.packages.lightning_supports_torch is False
    assert facts.packages.deepspeed_supports_torch is False  # torch._six, removed in torch 2.0
    assert facts.packages.transformers_supports_torch is None  # not installed: nothing to say
    assert facts.packages.torch_requirements_unmet == [
        "deepspeed 0.7.3 needs torch<2.0",
        "lightning 2.7.0 needs torch>=2.6",
    ]


def test_gpus_named_only_in_the_log_still_resolve():
    log = "RuntimeError: NCCL Error 1: unhandled cuda error (NVIDIA GeForce RTX 5090)\nNCCL version 2.21.5+cuda12.4\n"
    facts = offline_facts(logs=[("train.log", io.StringIO(log))])
    assert facts.gpus.arch == ["blackwell"] and facts.gpus.consumer is True
    assert facts.torch.supports_gpu_arch is False  # CUDA 12.4, from the NCCL banner
    assert facts.torch.nccl_supports_gpu_arch is False  # Blackwell needs NCCL 2.25.1
    mixed = offline_facts(logs=[("t.log", io.StringIO("hangs on my GeForce RTX 5070 Ti and an RTX 3090\n"))])
    assert mixed.gpus.p2p_support == ["unsupported", "unreliable"] and mixed.gpus.distinct_archs == 2
    unrelated = offline_facts(logs=[("t.log", io.StringIO("stuck after block L4 of the decoder\n"))])
    assert unrelated.gpus.arch is None


def test_a_new_gpu_model_is_one_table_row(tmp_path, monkeypatch):
    """A GPU released after this table was written: unknown until one row names it, then the
    derived facts and the architecture rule handle it without any rule changing."""
    root = copy_kb(tmp_path)
    gpus = root / "tables" / "gpus.yaml"
    before = gpus.read_text(encoding="utf-8")
    row = '  - {name: GeForce RTX 6090, capability: "12.0", class: consumer, p2p: unsupported}\n'
    after = before.replace("models:\n", "models:\n" + row, 1)
    rule = next(r for r in load_kb().rules if r.id == "env.gpu-arch-unsupported")

    def diagnose(text: str) -> tuple[Facts, list[str]]:
        monkeypatch.setattr(tables, "shipped", lambda: load_tables(root))
        gpus.write_text(text, encoding="utf-8")
        facts = facts_with("NVIDIA GeForce RTX 6090", TorchBuild(version="2.5.1+cu124", cuda="12.4"))
        report = evaluate(facts, KB(rules=[rule], sources=[]))
        return facts, [f.id for f in report.findings if f.basis == "evidence"]

    facts, found = diagnose(before)
    assert facts.gpus.arch is None and facts.torch.supports_gpu_arch is None and found == []
    facts, found = diagnose(after)
    assert len(after.splitlines()) == len(before.splitlines()) + 1
    assert facts.gpus.arch == ["blackwell"] and facts.gpus.consumer is True
    assert facts.torch.supports_gpu_arch is False and found == ["env.gpu-arch-unsupported"]


# --- no model names or version numbers in log patterns (diagnose/kblint.py) ------------------


def test_no_rule_names_a_gpu_model_or_version_in_a_log_pattern():
    # `diagnose kb lint` fails on each of these, so the list stays empty
    offenders = naming_offenders(load_kb().rules)
    assert not offenders, "log patterns naming what kb/tables/ knows; test a table fact instead:\n" + "\n".join(
        f"  {rid}: {hit}" for rid, hits in sorted(offenders.items()) for hit in hits
    )


OLD_STYLE_RULE = r"""
id: test.names-in-patterns
title: The patterns the table facts replaced
severity: error
explains: [crash.cuda]
evidence:
  - {log: '(?i)\bRTX (?:PRO )?50\d0\b|RTX PRO 6000 Blackwell|\bB[12]00\b|\bGB200\b|Blackwell', weight: 2}
  - {log: '(?i)\+cu(?:9\d|10\d|11\d|12[0-7])\b|NCCL version [\d.]+\+cuda(?:9|10|11|12\.[0-7])\b', weight: 1}
  - {log: '(?i)NCCL (?:version|error).*\b2\.[0-7]\.\d+', weight: 2}
  - {log: '(?i)requires? (?:torch|deepspeed|pytorch)[ ><=!~]+[\d.]+', weight: 1}
explain: x
fix: [{title: x, kind: shell, snippet: x}]
references: [https://github.com/pytorch/pytorch/issues/152077]
examples:
  - {name: a, expect: match, log: "Blackwell"}
  - {name: b, expect: no-match, log: "fine"}
"""


def test_the_naming_check_catches_the_patterns_the_tables_replaced(tmp_path):
    folder = tmp_path / "test"
    folder.mkdir()
    (folder / "names-in-patterns.yaml").write_text(OLD_STYLE_RULE, encoding="utf-8")
    hits = naming_offenders(load_kb([tmp_path], shipped=False).rules)["test.names-in-patterns"]
    assert len(hits) == 3  # the model names, the CUDA builds, the NCCL releases; not "[\d.]+"
    by_pattern = {hit.split("': ")[0]: hit.split("': ")[1] for hit in hits}
    names = next(v for k, v in by_pattern.items() if "GB200" in k)
    assert "blackwell" in names and "gb200" in names and "b200" in names
    assert all("a version number" in v for k, v in by_pattern.items() if "GB200" not in k)


def test_kb_paths_lists_the_derived_facts_built_on_the_tables():
    from diagnose.paths import known_paths

    listed = set(known_paths())
    derived = {"gpus.arch", "torch.supports_gpu_arch", "driver.supports_torch_cuda"}
    derived |= {f"packages.{name}" for name in ("lightning_supports_torch", "torch_requirements_unmet")}
    assert derived <= listed, sorted(derived - listed)


@pytest.mark.parametrize("build", ["2.8.0.dev20250402+cu128", "2.1.0a0+32f93b1"])
def test_a_nightly_or_container_build_has_no_bundled_nccl_from_the_release_table(build):
    """A nightly or an NGC/source build pins its own NCCL: the release's row says nothing of it."""
    assert TorchBuild(version="2.5.1+cu124").bundled_nccl is not None
    assert TorchBuild(version=build).bundled_nccl is None


def test_ampere_workstation_cards_are_found_without_their_rtx_prefix():
    """Users write "4x A6000" for the RTX A6000; "A100" stays the datacenter card."""
    found = tables.shipped().models_in
    assert found("four Nvidia A6000 GPUs") == ("RTX A6000",)
    assert found("NVIDIA RTX A6000") == ("RTX A6000",)
    assert found("NVIDIA A100-SXM4-80GB") == ("A100",)


@pytest.mark.parametrize(
    "text, models",
    [
        ("node 1: p3.8xlarge (4 GPUs), node 2: g5.12xlarge", ("A10G", "V100")),
        ("a SageMaker notebook instance (ml.g5.12xlarge)", ("A10G",)),
        ("two a2-highgpu-8g VMs on GCP", ("A100",)),
        ("p5en.48xlarge", ("H200",)),
        ("p6-b200.48xlarge", ("B200",)),
        # a family without a size is a word, not an instance ("p3" of a paper, "g5" of a grid)
        ("python3.8 in section p3", ()),
        ("the g5 nodes", ()),
    ],
)
def test_cloud_instance_types_name_their_gpu_model(text, models):
    assert tables.shipped().models_in(text) == models


def test_an_instance_type_is_a_family_and_a_size_pattern(tmp_path):
    with pytest.raises(ValueError, match="instance type"):
        tables.GpuModel.model_validate(
            {"name": "V100", "capability": "7.0", "class": "datacenter", "p2p": "supported", "instances": ["p3"]}
        )


@pytest.mark.parametrize(
    "text, models",
    [
        # the Ti suffix joined or hyphenated, as users type it
        ("混合显卡（3090和2080ti）", ("GeForce RTX 3090", "GeForce RTX 2080 Ti")),
        ("4 * GTX 1080TI", ("GeForce GTX 1080 Ti",)),
        ("a 1080-Ti", ("GeForce GTX 1080 Ti",)),
        # plurals and possessives name the model too
        ("a new node with H100s beside our A100 nodes", ("H100", "A100")),
        ("the 3090's fan", ("GeForce RTX 3090",)),
        ("two A10s", ("A10",)),
        ("T4s", ("T4",)),
        # the Pascal and Turing Quadro cards
        ("mismatched GPUs (Quadro P6000 + RTX A5000)", ("RTX A5000", "Quadro P6000")),
        # a number inside a longer word is not a GPU
        ("res_rtx3090ubuntu.pdf", ()),
        ("A100s3", ()),
    ],
)
def test_gpu_names_are_read_as_users_write_them(text, models):
    assert tables.shipped().models_in(text) == models
