"""probes.offline: reports and logs combined into one Facts."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from probes.facts import Facts
from probes.log import LogError, known_signatures
from probes.offline import offline_facts

REPORTS = Path(__file__).resolve().parent.parent / "fixtures" / "reports"
LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "logs"


def test_report_and_log_together():
    env = (REPORTS / "collect_env_2.0_windows.txt").read_text()
    facts = offline_facts([("env.txt", env)], [("train.log", LOGS / "torchrun_sigkill.log")])
    assert facts.inputs == ["report:env.txt", "log:train.log"]
    assert facts.torch.source == "report" and facts.torch.version == "2.0.1+cu117"
    assert facts.packages.complete is False
    assert facts.log.source == "log" and facts.log.sources == ["train.log"]
    assert "sigkill_exit" in facts.log.signature_ids and facts.log.failing_ranks == [0]
    assert {s.what for s in facts.skipped} == {"live probes", "micro-tests"}
    Facts.model_validate(facts.model_dump())


def test_no_log_leaves_log_evidence_unknown():
    facts = offline_facts([("env", (REPORTS / "collect_env_1.1_yes_no.txt").read_text())])
    assert facts.log.source is None and facts.log.signatures is None and facts.log.lines is None


def test_a_warning_pasted_in_the_report_counts_as_log_evidence():
    env = (
        "/envs/rise/lib/python3.8/site-packages/torch/cuda/__init__.py:173: UserWarning: \n"
        "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch ins"
    )
    facts = offline_facts([("env", env)])
    assert facts.log.signature_ids == ["cuda_arch_incompatible"]
    assert facts.log.sources == ["report:env"]
    (gpu,) = facts.gpus.devices
    assert (gpu.name, gpu.compute_capability) == ("NVIDIA GeForce RTX 5090", "12.0")


def test_first_statement_wins_and_keyed_sections_merge():
    facts = offline_facts(
        [
            ("a", "PyTorch version: 2.1.0\n[pip3] numpy==1.26.0"),
            ("b", "PyTorch version: 1.13.1\n[pip3] deepspeed==0.12.0"),
        ]
    )
    assert facts.torch.version == "2.1.0"
    assert facts.packages.values == {"torch": "2.1.0", "numpy": "1.26.0", "deepspeed": "0.12.0"}


def test_several_logs_keep_their_sources():
    facts = offline_facts(
        logs=[
            ("a.log", io.StringIO("RuntimeError: Address already in use")),
            ("b.log", io.StringIO("ok\nRuntimeError: Connection refused")),
        ]
    )
    assert facts.log.sources == ["a.log", "b.log"] and facts.log.lines_read == 3
    assert [(s.id, s.source) for s in facts.log.signatures if s.id != "python_exception"] == [
        ("address_in_use", "a.log"),
        ("connection_refused", "b.log"),
    ]


def test_binary_log_raises_log_error(tmp_path):
    path = tmp_path / "core.log"
    path.write_bytes(b"\x00\x01\x02\x03" * 1000)
    with pytest.raises(LogError, match="core.log"):
        offline_facts(logs=[("core.log", path)])


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "$ torchrun --nproc_per_node=8 --nnodes=2 --node_rank=1 --master_addr=10.0.0.1 --master_port=1234 train.py",
            {
                "kind": "torchrun",
                "local_world_size": 8,
                "nnodes": 2,
                "node_rank": 1,
                "master_port": 1234,
                "master_addr": "10.0.0.1",
                "devices_requested": 8,
            },
        ),
        ("master节点的master_addr设置成127.0.0.1会报错", {"master_addr": "127.0.0.1"}),
        (
            "python -m torch.distributed.launch --nproc_per_node 4 train.py",
            {"kind": "torchrun", "local_world_size": 4, "devices_requested": 4},
        ),
        ("srun python train.py --num-nodes 2 --gpus 4", {"kind": "slurm", "nnodes": 2, "devices_requested": 4}),
        ("I use mpirun -np 4 python xx.py", {"kind": "mpirun", "world_size": 4}),
        ("`accelerate launch sft_llama2.py --output_dir=sft`", {"kind": "accelerate"}),
        (
            "accelerate launch --num_processes=2 train.py",
            {"kind": "accelerate", "world_size": 2, "devices_requested": 2},
        ),
        ("notebook_launcher(train_loop, args, num_processes=4)", {"kind": "accelerate", "devices_requested": 4}),
        (
            'trainer = L.Trainer(max_epochs=10, devices=2, strategy="ddp", logger=None)',
            {"strategy": "ddp", "devices_requested": 2},
        ),
        (
            "Trainer(accelerator='gpu', devices=[0, 1], strategy=DDPStrategy(find_unused_parameters=True))",
            {"strategy": "ddp", "devices_requested": 2},
        ),
        ('Passing `accelerator="ddp"` the job hangs', {"strategy": "ddp"}),
        ('I tried to pass `--gpus "0,0"` to the Lightning Trainer', {"devices_requested": 2}),
    ],
)
def test_launcher_as_stated(text, expected):
    launcher = offline_facts(logs=[("log", io.StringIO(text))]).launcher
    got = {k: v for k, v in launcher.model_dump().items() if v is not None and k not in ("source", "unavailable")}
    assert got == expected
    assert launcher.source == "log"


@pytest.mark.parametrize(
    ("text", "short"),
    [
        # Lightning under SLURM took one task as the world, though four devices were asked for
        ("Fabric(devices=4)\nInitializing distributed: GLOBAL_RANK: 0, MEMBER: 1/1", True),
        ("Fabric(devices=2)\nInitializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2", False),
        ("Fabric(devices=4)", None),
    ],
)
def test_ranks_short_of_devices_is_derived_from_the_world_and_the_devices(text, short):
    assert offline_facts(logs=[("log", io.StringIO(text))]).launcher.ranks_short_of_devices is short


def test_visible_devices_and_notebooks():
    facts = offline_facts(
        logs=[
            (
                "log",
                io.StringIO(
                    "CUDA_VISIBLE_DEVICES=1,2 python -m torch.distributed.launch --nproc_per_node=4 train.py\n"
                    'File "/tmp/ipykernel_1234/3456.py", line 3, in <module>'
                ),
            )
        ]
    )
    assert facts.gpus.visible == ["1", "2"] and facts.env.values["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert facts.host.interactive is True


@pytest.mark.parametrize(
    "text",
    [
        "jupyter-vmarkovtsev:15833:15833 [0] NCCL INFO Bootstrap : Using [0]eth0:10.2.3.32<0>",
        "the job hangs in the jupyter-hub cluster login node? no, in a script",
        "strategy is ddp but it hangs",
    ],
)
def test_what_is_not_stated_stays_unknown(text):
    facts = offline_facts(logs=[("log", io.StringIO(text))])
    assert facts.host.interactive is None
    assert facts.launcher.strategy is None and facts.launcher.kind is None


def test_lightning_banners_and_nccl_info_fill_facts():
    log = "\n".join(
        [
            "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0]",
            "initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/2",
            "host:1:1 [0] NCCL INFO NCCL_P2P_DISABLE set by environment to 1",
            "NCCL version 2.18.1+cuda12.1",
        ]
    )
    facts = offline_facts(logs=[("log", io.StringIO(log))])
    assert facts.launcher.world_size == 2 and facts.gpus.visible == ["0"]
    assert facts.env.values == {"NCCL_P2P_DISABLE": "1"} and facts.torch.nccl == "2.18.1"


def test_lightning_gpu_banner():
    facts = offline_facts(logs=[("log", io.StringIO("GPU available: False, used: False\nTPU available: False"))])
    assert facts.torch.cuda_available is False


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=600), st.text(max_size=600))
def test_fuzz_offline_never_raises_on_text(report_text, log_text):
    try:
        facts = offline_facts([("env", report_text)], [("log", io.StringIO(log_text))])
    except LogError as exc:  # only for a log that is mostly control characters
        assert str(exc).startswith("log: not a text log")
        return
    Facts.model_validate(facts.model_dump())
    assert facts.inputs == ["report:env", "log:log"]


def test_a_table_pasted_in_the_log_is_a_fact_from_the_log():
    log = (REPORTS / "nccl_tests_header.txt").read_text()
    facts = offline_facts([("env", "PyTorch version: 2.1.0")], [("log", io.StringIO(log))])
    assert facts.gpus.count == 4 and facts.gpus.source == "log"
    assert facts.torch.source == "report" and facts.torch.version == "2.1.0"


CASES = sorted((REPORTS.parents[2].parent / "shared" / "cases").glob("*.yaml")) + sorted(
    (REPORTS.parents[1] / "cases").glob("*.yaml")
)


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_real_cases_read_cleanly(path):
    case = yaml.safe_load(path.read_text())
    facts = offline_facts([("env", case["env_report"])], [("log", io.StringIO(case["title"] + "\n" + case["log"]))])
    Facts.model_validate(facts.model_dump())
    from_log = [line for line in facts.log.lines if line.source == "log"]
    assert len(from_log) == len((case["title"] + "\n" + case["log"]).splitlines())
    assert all(s.id in known_signatures() for s in facts.log.signatures)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=2000))
def test_a_report_never_raises(report_text):
    facts = offline_facts([("env", report_text)])
    Facts.model_validate(facts.model_dump())


def test_a_wheels_cuda_tag_in_prose_means_a_cuda_build():
    torch = offline_facts(logs=[("log", ["pip install torchvision==0.17.2+cu121\n"])]).torch
    assert (torch.cuda, torch.cuda_build) == ("12.1", True)
    # an index URL names the CUDA, not what was installed from it
    torch = offline_facts(logs=[("log", ["--index-url https://download.pytorch.org/whl/cu118\n"])]).torch
    assert (torch.cuda, torch.cuda_build) == ("11.8", None)


def test_a_torch_release_stated_in_prose_is_the_torch_version():
    def stated(text: str) -> str | None:
        return offline_facts(logs=[("log", [text + "\n"])]).torch.version

    assert stated("fsdp2 train report error when torch=2.5.1") == "2.5.1"
    assert stated("- Training framework: PyTorch 2.7.1+cu128") == "2.7.1+cu128"
    assert stated("pytorch版本2.0.1，单机多卡") == "2.0.1"
    assert stated("Our cluster module still provides torch 1.13.1. Training steps run fine") == "1.13.1"
    assert stated("- Reinstalled torch (2.2.2+cu121) and lightning in a fresh venv") == "2.2.2+cu121"
    # requirements and other packages are no statement of the installed torch
    for text in ("needs torch>=2.4", "torchvision 0.15.2", "pytorch-lightning 1.9.0", "lightning.pytorch 2.1.0"):
        assert stated(text) is None, text
    # a report's own field wins over prose
    facts = offline_facts(
        reports=[("r", "PyTorch version: 2.1.0+cu121\n")], logs=[("log", ["I also tried torch 2.3.0\n"])]
    )
    assert facts.torch.version == "2.1.0+cu121"
    assert offline_facts(logs=[("log", ["torch==2.0.1+cu118\n"])]).torch.cuda == "11.8"


def test_two_strategies_named_leave_the_strategy_unknown():
    def strategy(text: str) -> str | None:
        return offline_facts(logs=[("log", [text + "\n"])]).launcher.strategy

    assert strategy('Trainer(strategy="fsdp", devices=4)') == "fsdp"
    # a switch compares them: which one failed is not said
    assert strategy('Switching from strategy="ddp" to strategy="fsdp" fails at the first save') is None


def test_lightning_stated_in_prose_is_the_installed_package():
    def packages(text: str) -> dict[str, str]:
        return offline_facts(logs=[("log", [text + "\n"])]).packages.values

    assert packages("Lightning 2.1.0, strategy='fsdp', 4x A100.")["lightning"] == "2.1.0"
    assert packages("PyTorch Lightning 1.8.6 with DDP")["pytorch-lightning"] == "1.8.6"
    assert packages("pytorch_lightning==1.9.4")["pytorch-lightning"] == "1.9.4"
    for text in ("lightning>=2.0", "lightning.pytorch 2.1.0 namespace", "Lightning Trainer hangs"):
        assert not {"lightning", "pytorch-lightning"} & set(packages(text)), text


def test_a_line_that_joins_two_gpu_models_names_both():
    def models(text: str) -> list[str] | None:
        return offline_facts(logs=[("log", [text + "\n"])]).gpus.models

    assert models("DDP on an RTX 3090 + RTX 2080 Ti box is slower") == ["GeForce RTX 3090", "GeForce RTX 2080 Ti"]
    assert models("after adding my old titan xp next to the 4090 gpu") == ["GeForce RTX 4090", "TITAN Xp"]
    # joined, two bare model numbers need no word for GPUs; two letter-and-number names do
    assert models("a6000 + 3090 in the same box") == ["RTX A6000", "GeForce RTX 3090"]
    assert models("blocks L4 + A10 in the same model") is None
    # two models compared are not this job's hardware
    assert models("with 3090 everything is fine but the A100 gpu hangs") is None


def test_the_driver_and_torchs_cuda_stated_in_prose():
    def facts(text: str):
        return offline_facts(logs=[("log", [text + "\n"])])

    stated = facts("my driver is 470.82 and torch is built with cu121")
    assert (stated.driver.version, stated.torch.cuda) == ("470.82", "12.1")
    assert facts("驱动版本 450.80.02，torch是cu118的").driver.version == "450.80.02"
    assert facts("pip install torch --index-url https://download.pytorch.org/whl/cu118").torch.cuda == "11.8"
    # numbers near the word that are no driver release, and tags that are no CUDA build
    for text in ("the driver crashed after 300 steps on 8 GPUs", "driver 2.1", "a cu12 fan", "cuda 11"):
        got = facts(text)
        assert got.driver.version is None and got.torch.cuda is None, text
    # a report's own field wins over prose
    both = offline_facts(reports=[("r", "Nvidia driver version: 535.104.05\n")], logs=[("log", ["driver 470.82\n"])])
    assert both.driver.version == "535.104.05"


def test_images_in_a_report_are_said_to_be_unread():
    text = 'the error is below\n![image](https://user-images.githubusercontent.com/1/2.png)\n<img src="x.png">\n'
    skipped = offline_facts(reports=[("r", text)], logs=[("log", text.splitlines(True))]).skipped
    assert skipped[0].what == "2 images in the report" and "paste the error as text" in skipped[0].reason
    assert not any("image" in s.what for s in offline_facts(logs=[("log", ["RuntimeError: boom\n"])]).skipped)


def test_a_log_that_names_gpus_marks_a_gpu_job():
    def gpu(*lines: str) -> bool | None:
        return offline_facts(logs=[("log", [line + "\n" for line in lines])]).log.mentions_gpu

    assert gpu("NCCL WARN NET/IB : Got completion with error 12") is True
    assert gpu("单机4卡训练报错") is True and gpu("多卡训练卡住") is True and gpu("显存不足") is True
    # Lightning's banner of a CPU run names no GPU job; nor does a log about something else
    assert gpu("GPU available: False, used: False", "Epoch 0: 100%") is False
    assert gpu("Epoch 0: 100%|##########| 10/10") is False
    assert offline_facts(reports=[("r", "PyTorch version: 2.1.0\n")]).log.mentions_gpu is None


@pytest.mark.parametrize(
    ("lines", "backend"),
    [
        (["distributed_backend=gloo", "All distributed processes registered. Starting with 2 processes"], "gloo"),
        (["INFO - __main__ - Distributed environment: MULTI_GPU  Backend: nccl"], "nccl"),
        (["[comm.py:637:init_distributed] Initializing TorchBackend in DeepSpeed with backend gloo"], "gloo"),
        (["RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer"], "gloo"),
        # NCCL named anywhere, even in the reader's words, and the log is not a gloo-only job's
        (["distributed_backend=gloo", "with NCCL_P2P_DISABLE=1 it did not help"], None),
        (["Epoch 0: 45%|████▌ | 45/100"], None),
    ],
)
def test_the_process_group_backend_is_read_only_when_the_log_names_one(lines, backend):
    assert offline_facts(logs=[("log", [line + "\n" for line in lines])]).log.backend == backend


def test_no_log_no_backend():
    assert offline_facts(reports=[("r", "PyTorch version: 2.1.0\n")]).log.backend is None


def test_the_store_host_of_a_tcp_init_method_is_the_master_address():
    def addr(text: str) -> str | None:
        return offline_facts(logs=[("log", text.splitlines(True))]).launcher.master_addr

    assert addr('dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=r)\n') == "127.0.0.1"
    assert addr("python train.py --dist-url tcp://10.0.0.5:23456 --world-size 2\n") == "10.0.0.5"
    assert addr('init_method="env://"\n') is None
