"""probes.report on environment reports as users posted them (tests/fixtures/reports/)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probes.facts import Facts
from probes.report import parse_report

FIXTURES = REPORTS_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "reports"


def report(name: str) -> Facts:
    return parse_report((FIXTURES / name).read_text(encoding="utf-8"), name)


def test_collect_env_modern_windows():
    f = report("collect_env_2.0_windows.txt")
    assert f.inputs == ["report:collect_env_2.0_windows.txt"]
    assert (f.torch.version, f.torch.cuda, f.torch.cuda_build, f.torch.cuda_available) == (
        "2.0.1+cu117",
        "11.7",
        True,
        True,
    )
    assert (f.host.platform, f.host.os, f.host.python) == ("win32", "Microsoft Windows 11 Pro", "3.9.16")
    assert f.driver.version == "535.98"
    assert f.gpus.count == 1 and f.gpus.models == ["NVIDIA GeForce GTX 1050 Ti"]
    assert f.packages.lookup("torchaudio") == (True, "2.0.2+cu117")
    # the Windows CPU block ("Architecture=9", "DeviceID=CPU0") is neither env nor packages
    assert f.env.values == {}
    assert f.host.cpu_count is None


def test_collect_env_torch_1_1_says_yes_and_no():
    f = report("collect_env_1.1_yes_no.txt")
    assert f.torch.version == "1.1.0" and f.torch.cuda == "9.0.176" and f.torch.cuda_available is True
    assert f.packages.values["torch-geometric"] == "1.3.2"
    assert f.gpus.models == ["GeForce RTX 2060"] and f.gpus.consumer is True


def test_collect_env_indented_with_could_not_collect():
    f = report("collect_env_1.3_indented.txt")
    assert f.torch.version == "1.3.1"
    assert f.torch.cuda is None and f.torch.cuda_build is None  # "Could not collect" is unknown
    assert f.torch.cuda_available is False
    assert f.gpus.models == ["GeForce RTX 2080 Ti"] and f.driver.version == "430.64"
    assert f.packages.values == {"torch": "1.3.1", "numpy": "1.19.1", "torchvision": "0.4.2"}


def test_collect_env_quoted_in_markdown():
    f = report("collect_env_1.5_windows_quoted.txt")
    assert f.host.platform == "win32"
    assert f.gpus.count == 2 and f.gpus.models == ["TITAN RTX", "TITAN RTX"]
    assert f.packages.values["mkl-service"] == "2.3.0"


def test_collect_env_rocm_build_has_no_cuda():
    f = report("collect_env_1.7_rocm.txt")
    assert f.torch.hip == "3.7.20315-077bcfa0" and f.torch.cuda is None
    # "GPU models and configuration: Device 66a1" is not a GPU model it can name
    assert f.gpus.devices is None and f.gpus.count is None


def test_collect_env_without_torch():
    f = report("collect_env_no_torch.txt")
    assert f.torch.version is None and f.torch.cuda_available is None
    assert f.gpus.count == 2 and f.driver.version == "390.12"
    assert f.packages.values["torch"] == "1.0.0a0+db5d313"  # conda lists a pip-installed torch


def test_lightning_collect_env_details():
    f = report("lightning_details_2.0_spaces.txt")
    assert f.gpus.count == 10 and set(f.gpus.models) == {"NVIDIA RTX A6000"}
    assert (f.torch.cuda, f.torch.cuda_available, f.torch.version) == ("11.7", True, "2.0.0")
    assert f.packages.lookup("lightning") == (True, "2.0.1")
    assert f.packages.lookup("pytorch_lightning") == (True, "1.9.3")
    assert f.packages.lookup("backports.functools-lru-cache") == (True, "1.6.4")


def test_lightning_details_with_tabs_and_a_truncated_tail():
    f = report("lightning_details_2.3_tabs.txt")
    assert f.gpus.count == 2 and f.packages.values["deepspeed"] == "0.14.0"
    assert "dill" not in f.packages.values  # cut off before its version


def test_free_form_bullets():
    f = report("lightning_freeform_filled.txt")
    assert f.torch.version == "1.7.1" and f.host.python == "3.8" and f.host.platform == "linux"
    assert f.gpus.models == ["GeForce RTX 2070"] and f.gpus.count is None
    # "CUDA/cuDNN version: CUDA 11.0" may be the toolkit, not torch's build: not taken
    assert f.torch.cuda is None


def test_several_gpus_listed_on_one_bullet():
    f = parse_report("- GPU 0: NVIDIA GeForce RTX 3090, GPU 1: NVIDIA GeForce RTX 2080 Ti\n", "r")
    assert f.gpus.models == ["NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 2080 Ti"]
    # one GPU per line, as nvidia-smi -L prints them, keeps its UUID
    one = parse_report("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-12ab)\n", "r")
    assert one.gpus.models == ["NVIDIA A100-SXM4-80GB"] and one.gpus.devices[0].uuid == "GPU-12ab"


def test_gpus_of_several_tasks_under_srun_labels():
    # srun -l nvidia-smi -L: each node prints its own GPU 0; the task label keeps them apart
    f = parse_report(
        "0: GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-6f1c0e2a-...)\n"
        "0: GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-0a77b1d3-...)\n"
        "1: GPU 0: Tesla V100-SXM2-32GB (UUID: GPU-5e2a9d10-...)\n"
        "1: GPU 1: Tesla V100-SXM2-32GB (UUID: GPU-11f93c5e-...)\n",
        "r",
    )
    assert [(d.node, d.index, d.name) for d in f.gpus.devices] == [
        ("0", 0, "NVIDIA A100-SXM4-40GB"),
        ("0", 1, "NVIDIA A100-SXM4-40GB"),
        ("1", 0, "Tesla V100-SXM2-32GB"),
        ("1", 1, "Tesla V100-SXM2-32GB"),
    ]
    # a UUID cut short is neither a UUID nor part of the name; the count is one node's
    assert f.gpus.devices[0].uuid is None and f.gpus.count == 2 and f.gpus.distinct_models == 2
    # one task's label alone names no other node
    one = parse_report("0: GPU 0: NVIDIA H100 80GB HBM3\n0: GPU 1: NVIDIA H100 80GB HBM3\n", "r")
    assert [d.node for d in one.gpus.devices] == [None, None] and one.gpus.count == 2


def test_gpu_models_of_nodes_from_their_feature_discovery_labels():
    # kubectl's node labels: one GPU model per node, spaces made dashes
    f = parse_report(
        '  "nvidia.com/gpu.product": "NVIDIA-A10G",\n'
        "worker-2 on gpu-pool-b (`nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB`), worker-0 on"
        " (`nvidia.com/gpu.product=NVIDIA-A10G`)\n"
    )
    assert [(d.node, d.name) for d in f.gpus.devices] == [
        ("label 0", "NVIDIA A10G"),
        ("label 1", "NVIDIA A100-SXM4-80GB"),
    ]
    assert f.gpus.distinct_models == 2 and f.gpus.count is None
    # one label names the model, no node
    one = parse_report("nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3\n")
    assert [(d.node, d.name) for d in one.gpus.devices] == [(None, "NVIDIA H100-80GB-HBM3")]


def test_platform_from_a_screenshot_name():
    # a pasted screenshot keeps its desktop's default name: GNOME, macOS, Windows 11
    assert parse_report("![Screenshot from 2022-12-12 17-11-14](https://x/1.png)\n").host.platform == "linux"
    assert parse_report("![Screen Shot 2022-12-12 at 5.11.14 PM](u)\n").host.platform == "darwin"
    assert parse_report('<img alt="Screenshot 2023-05-18 102523" src="u">\n').host.platform == "win32"
    # a stated platform outweighs the screenshot, wherever either stands
    both = parse_report("![Screenshot from 2022-12-12 17-11-14](u)\nOS: Windows 10\n")
    assert both.host.platform == "win32"
    assert parse_report("a screenshot of the error\n").host.platform is None


def test_variables_set_from_python():
    f = parse_report(
        '    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"\n'
        "os.environ.setdefault('NCCL_DEBUG', 'INFO')\n"
        'os.environ["HF_TOKEN"] = "hf_secret"\n'
    )
    # a variable outside the allow-list (a token) is never taken
    assert f.env.values == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "NCCL_DEBUG": "INFO"}
    # set before a command, a variable is mostly the fix a report shows, not the failing setting
    assert parse_report("NCCL_P2P_LEVEL=NVL torchrun --nproc_per_node=2 main.py\n").env.values == {}


def test_short_bullets():
    f = report("lightning_bullets_short.txt")
    assert f.packages.values == {"pytorch-lightning": "1.8.3.post1", "torch": "1.10.1+cu113"}
    assert f.torch.cuda == "11.3"  # from the +cu113 local version


def test_bullet_answers_in_markdown_emphasis_and_quotes():
    # Lightning's template answered in bold and quotes (Lightning-AI/pytorch-lightning#9639)
    f = parse_report("- PyTorch Version (e.g., 1.8): **'1.6.0+cu101'**\n- Python version: __3.6__\n")
    assert f.torch.version == "1.6.0+cu101" and f.torch.cuda_build is True and f.host.python == "3.6"


def test_plus_bullets_are_no_table_border():
    # a "+ key: value" list (PaddlePaddle/models#2908), not an nvidia-smi "+-----+" border
    f = parse_report("+ system: centos6u3\n+ python: 2.7.14\n+ nccl: 2.2.13\n")
    assert f.torch.nccl == "2.2.13" and f.host.python == "2.7.14"
    # a release without its patch number says too little to compare with a minimum
    assert parse_report("- NCCL version: 2.18\n").torch.nccl is None


def test_unfilled_template_states_nothing():
    assert report("lightning_template_unfilled.txt") == Facts(inputs=["report:lightning_template_unfilled.txt"])


def test_accelerate_env_with_config():
    f = report("accelerate_env_0.30_config.txt")
    assert f.packages.values["accelerate"] == "0.30.1"
    assert (f.torch.version, f.torch.cuda_available) == ("2.3.0+cu121", True)
    assert f.host.memory_total_bytes == int(755.37 * 2**30)
    assert f.gpus.models == ["Tesla V100-SXM2-32GB"] and f.gpus.count is None
    assert (f.launcher.strategy, f.launcher.world_size, f.launcher.nnodes) == ("ddp", 1, 2)
    assert f.host.kernel == "3.10.0-1160.76.1.el7.x86_64"


def test_ds_report():
    f = report("ds_report_0.15.txt")
    assert f.packages.values["deepspeed"] == "0.15.5+unknown"
    assert (f.torch.version, f.torch.cuda) == ("2.3.0+cu121", "12.1")
    assert f.host.shm_total_bytes == int(125.77 * 2**30)
    assert "async-io" not in f.packages.values and "ninja" not in f.packages.values


@pytest.mark.parametrize(
    "name, driver, cuda, models, used",
    [
        ("nvidia_smi_535_rtx3090.txt", "535.113.01", "12.2", ["NVIDIA GeForce RTX 3090"] * 2, [2.0, 2.0]),
        ("nvidia_smi_560_h100.txt", "560.35.03", "12.9", ["NVIDIA H100 80GB HBM3"] * 2, [4.0, 112.0]),
        ("nvidia_smi_610_kmd.txt", "610.57.04", "13.3", ["NVIDIA GeForce RTX 5090"] * 2, [29024.0, 29174.0]),
    ],
)
def test_nvidia_smi_tables(name, driver, cuda, models, used):
    f = report(name)
    assert (f.driver.version, f.driver.cuda_version) == (driver, cuda)
    assert f.gpus.models == models and f.gpus.count == len(models)
    assert [d.memory_used_mib for d in f.gpus.devices] == used
    assert all(d.processes is None for d in f.gpus.devices)  # no process table: unknown


def test_nvidia_smi_h100_ecc_and_mig():
    devices = report("nvidia_smi_560_h100.txt").gpus.devices
    assert [(d.ecc_errors, d.mig_mode, d.persistence_mode) for d in devices] == [(0, False, True)] * 2
    assert devices[1].pci_bus_id == "00000000:2A:00.0"


def test_nvidia_smi_process_table_is_no_device_count():
    f = report("nvidia_smi_processes_mig.txt")
    assert f.gpus.count is None
    assert f.gpus.max_processes_per_gpu == 4 and f.gpus.processes_on_gpu0 == 1
    assert f.gpus.devices[0].processes[0].cmdline == "tritonserver"


def test_nvidia_smi_table_with_processes_marks_idle_gpus():
    table = (FIXTURES / "nvidia_smi_560_h100.txt").read_text()
    procs = "\n".join(
        [
            "| Processes:                                                                              |",
            "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
            "|=========================================================================================|",
            "|    1   N/A  N/A            4242      C   python                                   108MiB |",
        ]
    )
    f = parse_report(table + "\n" + procs)
    assert f.gpus.devices[0].processes == [] and len(f.gpus.devices[1].processes) == 1


def test_process_rows_pasted_without_the_table_header():
    # users paste the rows that matter; the first often loses its leading "|"
    rows = "\n".join(
        [
            "0   N/A  N/A   2579940      C   .../envs/ffcv/bin/python3.9    13724MiB |",
            "|    0   N/A  N/A   2579941      C   .../envs/ffcv/bin/python3.9      414MiB |",
            "|    1   N/A  N/A   2579941      C   .../envs/ffcv/bin/python3.9    13868MiB |",
        ]
    )
    f = parse_report(rows)
    assert f.gpus.processes_on_gpu0 == 2
    assert [p.used_memory_mib for p in f.gpus.devices[0].processes] == [13724, 414]
    # a partial paste says nothing of the GPUs it leaves out
    table = (FIXTURES / "nvidia_smi_560_h100.txt").read_text()
    gpu0_rows = "\n".join(rows.splitlines()[:2])
    assert parse_report(table + "\n" + gpu0_rows).gpus.devices[1].processes is None


def test_a_table_row_that_is_not_a_process_is_no_process():
    f = parse_report("| 0  1  2  3  4 C something 12MiB |\n| 30%   45C    P2   120W / 350W |   8019MiB / 24576MiB |")
    assert f.gpus.processes_on_gpu0 is None


def test_topology_matrix():
    f = report("nvidia_smi_topo_8gpu.txt")
    links = {(link.a, link.b): link.common_ancestor for link in f.gpus.topology}
    assert links[(0, 1)] == "PIX" and links[(0, 4)] == "SYS" and links[(4, 7)] == "PHB"
    assert f.gpus.p2p_ok is None  # the link type alone does not say P2P works


def test_topology_and_p2p_matrix():
    (link,) = report("nvidia_smi_topo_p2p_2x5090.txt").gpus.topology
    assert (link.a, link.b, link.common_ancestor, link.p2p_read) == (0, 1, "PHB", "not_supported")


def test_p2p_bandwidth_test_header():
    f = report("p2p_bandwidth_gtx1080ti.txt")
    assert f.gpus.count == 4 and f.gpus.p2p_ok is False
    ok = {(link.a, link.b) for link in f.gpus.topology if link.p2p_read == "ok"}
    assert ok == {(0, 1), (2, 3)}
    assert f.gpus.devices[2].pci_bus_id == "00000000:82:00.0"


def test_nccl_tests_header():
    f = report("nccl_tests_header.txt")
    assert f.gpus.count == 4 and f.gpus.models == ["GeForce GTX 1080 Ti"] * 4


def test_env_lines_are_allow_listed_and_never_secrets():
    f = parse_report(
        "NCCL_P2P_DISABLE=1\nexport NCCL_DEBUG=INFO\nHF_TOKEN=abc\nAWS_SECRET_ACCESS_KEY=x\n"
        "CUDA_VISIBLE_DEVICES=0,0\nPATH=/usr/bin"
    )
    assert f.env.values == {"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0,0"}
    assert f.env.complete is False
    assert f.gpus.visible == ["0", "0"] and f.gpus.visible_duplicates is True


def test_pip_freeze_lines():
    f = parse_report("torch==2.1.0\npytorch-lightning==2.1.2\nlightning==2.1.2\n")
    assert f.packages.lookup("pytorch_lightning") == (True, "2.1.2")
    assert f.packages.lookup("deepspeed") == (False, None)  # not named: unknown, not absent


@pytest.mark.parametrize(
    "text",
    [
        "",
        "I think torch is fine. Python: not sure which one",
        "The GPU: it freezes after epoch 3",
        "Is CUDA available (TensorFlow): No",
        "os: who knows",
        "Error: something went wrong at 12:30:45",
        "GPU models and configuration: Could not collect",
        "| this | is | a | markdown | table |",
    ],
)
def test_prose_is_not_misread(text):
    assert parse_report(text) == Facts(inputs=["report:report"])


def test_binary_and_mixed_encodings_do_not_raise():
    junk = bytes(range(256)).decode("latin-1") * 20
    mixed = "PyTorch version: 2.1.0\n" + "caf\udce9 GPU 0: \x00\x01" + "\n[pip3] torch==2.1.0\ufffd\n"
    assert parse_report(junk).torch.version is None
    assert parse_report(mixed).torch.version == "2.1.0"
    truncated = (FIXTURES / "collect_env_2.0_windows.txt").read_text()[:333]
    assert parse_report(truncated).torch.version == "2.0.1+cu117"


_LINES = st.sampled_from([line for p in sorted(FIXTURES.glob("*.txt")) for line in p.read_text().splitlines()])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_LINES, st.text(max_size=200)), max_size=40))
def test_fuzz_never_raises_and_validates(lines):
    facts = parse_report("\n".join(lines))
    Facts.model_validate(facts.model_dump())
    assert facts.packages.complete is False


def test_conda_list_says_cpu_or_cuda_build():
    cpu = parse_report(
        "# Name                    Version                   Build  Channel\n"
        "_libgcc_mutex             0.1                        main  \n"
        "_pytorch_select           0.1                       cpu_0  \n"
        "I then ran the script"
    )
    assert cpu.torch.cuda_build is False and cpu.packages.lookup("_pytorch_select") == (True, "0.1")
    gpu = parse_report(
        (REPORTS_DIR / "collect_env_no_torch.txt").read_text()
        + "\n[conda] pytorch                   1.10.2          py3.9_cuda11.3_cudnn8.2.0_0    pytorch"
    )
    assert gpu.torch.cuda_build is True and gpu.torch.cuda == "11.3"


def test_nccl_from_the_pip_nccl_wheel():
    f = parse_report("PyTorch version: 2.1.0+cu121\n[pip3] nvidia-nccl-cu12==2.18.1\n[pip3] torch==2.1.0")
    assert f.torch.nccl == "2.18.1" and f.packages.lookup("nvidia_nccl_cu12") == (True, "2.18.1")


def test_pip_list_rows_of_tracked_packages_only():
    text = "deepspeed 0.8.0\nUbuntu 20.04\nPython 3.8\nPackage    Version\n---------- -------\ntorch      2.0.1\nrequests   2.31.0\n"
    assert parse_report(text).packages.values == {"deepspeed": "0.8.0", "torch": "2.0.1"}


@pytest.mark.parametrize(
    ("banner", "torch", "gpus"),
    [
        (
            "Ultralytics 8.3.100 🚀 Python-3.12.9 torch-2.8.0.dev20250402+cu128 CUDA:0 (NVIDIA GeForce RTX 5090, 32112MiB)\n"
            "                                                              CUDA:1 (NVIDIA GeForce RTX 5090, 32107MiB)",
            "2.8.0.dev20250402+cu128",
            ["NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 5090"],
        ),
        (
            "YOLOv5 🚀 2021-4-24 torch 1.8.1+cu111 CUDA:0 (GeForce RTX 3090, 24268.3125MB)",
            "1.8.1+cu111",
            ["GeForce RTX 3090"],
        ),
        ("YOLOv5 🚀 v6.1 Python-3.8.10 torch-1.10.1+cu113 CPU", "1.10.1+cu113", []),
    ],
)
def test_the_ultralytics_banner_names_torch_and_the_gpus(banner, torch, gpus):
    facts = parse_report(banner)
    assert facts.torch.version == torch
    assert [d.name for d in facts.gpus.devices or []] == gpus


@pytest.mark.parametrize(
    ("line", "names"),
    [
        ("- 使用两台NVIDIA A100-SXM4-80GB GPU", ["A100"]),
        ("I train on 4 RTX 3090 cards with DDP", ["GeForce RTX 3090"]),
        ("the loss goes down fine", []),
    ],
)
def test_a_sentence_naming_a_gpu_model_gives_that_model(line, names):
    assert [d.name for d in parse_report(line).gpus.devices or []] == names


def test_gpus_under_one_cut_name_with_different_memory_are_different_models():
    # nvidia-smi cuts long names: "NVIDIA GeForce ..." is a 3090 (24 GiB) and a 3060 (12 GiB) here
    rows = "\n".join(
        [
            "|   0  NVIDIA GeForce ...  Off  | 00000000:01:00.0 Off |                  N/A |",
            "| 30%   55C    P2   142W / 350W |  17012MiB / 24576MiB |     34%      Default |",
            "|   1  NVIDIA GeForce ...  Off  | 00000000:05:00.0 Off |                  N/A |",
            "| 31%   57C    P2   139W / 350W |  17010MiB / 24576MiB |     36%      Default |",
            "|   2  NVIDIA GeForce ...  Off  | 00000000:09:00.0 Off |                  N/A |",
            "| 68%   79C    P2   169W / 170W |  11890MiB / 12288MiB |    100%      Default |",
        ]
    )
    gpus = parse_report(rows).gpus
    assert set(gpus.models) == {"NVIDIA GeForce"} and gpus.distinct_models == 2
    # one model's totals differ only by how each tool counts them: still one model
    same = parse_report(rows.replace("12288MiB", "23900MiB")).gpus
    assert same.distinct_models == 1


def test_a_manifests_env_entries_are_settings():
    manifest = "\n".join(
        [
            "        env:",
            "          - name: NCCL_ASYNC_ERROR_HANDLING",
            '            value: "0"',
            "          - name: HF_TOKEN",
            "            value: hf_abcdefghijklmnopqrstuvwxyz123456",
            "          - {name: NCCL_DEBUG, value: INFO}",
        ]
    )
    assert parse_report(manifest).env.values == {"NCCL_ASYNC_ERROR_HANDLING": "0", "NCCL_DEBUG": "INFO"}
