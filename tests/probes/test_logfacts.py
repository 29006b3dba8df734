"""Structured facts from a log's state lines and tracebacks (probes.logfacts), on real reports
and on lines in the exact formats NCCL (src/init.cc, src/bootstrap.cc) and torchrun print."""

from pathlib import Path

import pytest
import yaml

from probes.offline import offline_facts

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "cases"


def _log(text: str):
    return offline_facts(logs=[("log", text.splitlines(True))]).log


def _case(path: Path):
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    case = yaml.safe_load(path.read_text(encoding="utf-8"))
    return _log(case["title"] + "\n" + case["log"])


def test_an_nccl_init_that_never_completes_is_a_fact_with_its_interface_and_version():
    log = _case(SHARED / "nccl-257-allreduce-hangs-intel-iommu.yaml")
    assert log.nccl is not None
    assert (log.nccl_versions, log.nccl.net, log.nccl.interfaces) == (["2.4.8"], "Socket", ["eth0"])
    assert log.nccl.init_completed is False
    assert log.nccl.hosts == ["jupyter-vmarkovtsev"]
    assert "NCCL INFO" in log.nccl.last_line


def test_each_host_of_nccl_version_banners_counts_as_a_node():
    """NCCL_DEBUG=INFO prints its version banner on each host: two hosts are two nodes, and two
    releases on them are the nodes' own (cluster.version-mismatch), not a second library on one."""
    facts = offline_facts(
        logs=[
            (
                "log",
                [
                    "node-a:1234:1234 [0] NCCL INFO NCCL version 2.18.1+cuda12.1\n",
                    "node-b:5678:5678 [0] NCCL INFO NCCL version 2.20.5+cuda12.4\n",
                ],
            )
        ]
    )
    assert facts.log.nccl.hosts == ["node-a", "node-b"]
    assert (facts.log.nccl_versions_differ, facts.launcher.multi_node) == (True, True)


def test_ranks_that_print_different_nccl_versions_differ():
    log = _log(
        "node1:11:11 [0] NCCL INFO Bootstrap : Using ens7:10.128.0.31<0>\n"
        "NCCL version 2.19.3+cuda12.3\n"
        "node2:12:12 [0] NCCL INFO Bootstrap : Using ens7:10.128.0.32<0>\n"
        "NCCL version 2.20.5+cuda12.4\n"
    )
    assert log.nccl_versions == ["2.19.3", "2.20.5"] and log.nccl_versions_differ


def test_a_system_library_beside_the_installed_release_is_two_versions():
    log = _log("- NCCL Version : NCCL 2.8.3 for CUDA 10.1\n/usr/lib64/libnccl.so.2.9.9\n/usr/lib64/libnccl.so.2\n")
    assert log.nccl_versions == ["2.8.3", "2.9.9"] and log.nccl_versions_differ


def test_two_releases_compared_in_a_sentence_differ():
    log = _log("This no longer works with nccl 2.12.10 (nccl 2.13 works)\n")
    assert log.nccl_versions == ["2.12.10", "2.13"] and log.nccl_versions_differ


def test_a_release_by_its_minor_is_the_full_release_of_that_minor():
    log = _log("NCCL version 2.18.1+cuda12.1\nit hangs with nccl 2.18 but nccl 2.18.1 is fine\n")
    assert log.nccl_versions == ["2.18.1"] and not log.nccl_versions_differ


def test_a_log_naming_no_nccl_release_has_no_versions():
    log = _log("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error\n")
    assert log.nccl_versions is None and log.nccl_versions_differ is None


def test_two_processes_opening_one_bus_id_are_a_shared_device_and_complete_init_is_seen():
    log = _log(
        "host-a:100:140 [0] NCCL INFO comm 0x55d3c0a8e2d0 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
        "host-a:101:141 [0] NCCL INFO comm 0x55d3c0a8f000 rank 1 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
        "host-a:100:140 [0] NCCL INFO Channel 00/0 : 0[1000] -> 1[1000] via SHM/direct/direct\n"
    )
    assert log.nccl.shared_devices == ["host-a:1000"]
    assert log.nccl.init_completed and log.nccl.nranks == 2


def test_ranks_on_their_own_gpus_share_nothing():
    log = _log(
        "host-a:100:140 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
        "host-a:101:141 [1] NCCL INFO comm 0x2 rank 1 nranks 2 cudaDev 1 busId 2000 - Init COMPLETE\n"
        "host-a:100:140 [0] NCCL INFO Channel 00/0 : 0[1000] -> 1[2000] via P2P/IPC\n"
    )
    assert log.nccl.shared_devices == [] and log.nccl.transports == ["P2P/IPC"]


def test_a_log_without_nccl_info_lines_has_no_nccl_state():
    assert _log("Epoch 1: 100%|##########| 10/10\nRuntimeError: boom\n").nccl is None


@pytest.mark.parametrize(
    ("line", "codes", "signals"),
    [
        ("  exitcode  : -9 (pid: 1234)", [-9], ["SIGKILL"]),
        ("[INFO] [launch.py:347:main] Process 4411 exits with return code = -11", [-11], ["SIGSEGV"]),
        ("subprocess.CalledProcessError: Command 'x' returned non-zero exit status 137.", [137], ["SIGKILL"]),
        ("  traceback : Signal 6 (SIGABRT) received by PID 5512", [], ["SIGABRT"]),
        ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 3311)", [1], []),
    ],
)
def test_launcher_exit_lines_become_codes_and_signals(line, codes, signals):
    log = _log(line + "\n")
    assert (log.exit_codes, log.exit_signals) == (codes, signals)


def test_a_deepspeed_launcher_killed_rank_is_sigkill_in_a_real_report():
    log = _case(ROOT / "tests" / "cases" / "anomalygpt-43-deepspeed-rc-9-host-ram.yaml")
    assert "SIGKILL" in log.exit_signals


def test_the_first_traceback_names_its_exception_and_the_users_innermost_frame():
    log = _log(
        "Traceback (most recent call last):\n"
        '  File "/work/train.py", line 41, in <module>\n'
        "    trainer.fit(model)\n"
        '  File "/usr/lib/python3.10/site-packages/lightning/pytorch/trainer/trainer.py", line 538, in fit\n'
        "    call._call_and_handle_interrupt(\n"
        "ModuleNotFoundError: No module named 'torch._six'\n"
    )
    assert log.failure.exception == "ModuleNotFoundError"
    assert log.failure.user_frame.file == "/work/train.py" and log.failure.user_frame.line == 41
    assert log.failure.explained  # import_error is more than "a Python exception"
    assert log.failure.library == "lightning"


def test_a_traceback_pasted_from_its_first_frame_names_the_library_that_failed():
    # no "Traceback" line, paths shortened: DeepSpeed called a torch API this torch lacks
    log = _log(
        "accelerate launch train.py fails in every process:\n"
        '  File ".../deepspeed/runtime/engine.py", line 300, in __init__\n'
        '  File ".../deepspeed/runtime/compiler.py", line 29, in disable\n'
        "    return torch.compiler.disable(func)\n"
        "AttributeError: module 'torch' has no attribute 'compiler'\n"
    )
    assert log.failure.exception == "AttributeError" and log.failure.library == "deepspeed"
    assert log.failure.user_frame is None  # both frames are DeepSpeed's, none the user's


def test_a_traceback_cut_short_still_gives_the_frame_it_reached():
    log = _case(ROOT / "tests" / "cases" / "hrnet-seg-171-nproc-more-than-visible-gpus.yaml")
    assert log.failure is not None and log.failure.user_frame.file == "tools/train.py"
    assert log.failure.user_frame.line == 98


def test_every_interface_a_net_line_lists_is_an_interface_nccl_uses():
    log = _log(
        "node01:4128:4128 [0] NCCL INFO Bootstrap : Using bond0:10.1.2.3<0>\n"
        "node01:4128:4128 [0] NCCL INFO NET/Socket : Using [0]bond0:10.1.2.3<0> [1]docker0:172.17.0.1<0> [2]br-5e3f:172.18.0.1<0>\n"
    )
    assert log.nccl.interfaces == ["bond0", "docker0", "br-5e3f"]


def test_releases_stated_line_by_line_are_compared():
    def log(text: str):
        return offline_facts(logs=[("log", text.splitlines(True))]).log

    assert log("[node0 rank 0]  torch 2.1.2+cu121\n[node1 rank 8]  torch 2.2.1+cu121\n").torch_versions_differ
    assert log("A: `2.0.1+cu117 11.7`\nB: `2.0.1+cu118 11.8`\n").torch_versions_differ is True
    # the same release stated shorter, or twice, is one release
    assert log("torch 2.1\n- PyTorch version (GPU?): 2.1.2+cu121 (True)\n").torch_versions_differ is False
    assert log("torchvision 0.16.0\n").torch_versions_differ is None
    two_tags = "box1: nvcr.io/nvidia/pytorch:23.10-py3\nbox2: nvcr.io/nvidia/pytorch:24.03-py3\n"
    assert log(two_tags).images_differ is True
    assert log("docker run nvcr.io/nvidia/pytorch:24.03-py3 on both\n").images_differ is False
    # several on one line: each is read, not only the line's first
    assert log("box1 has nvcr.io/nvidia/pytorch:23.10-py3, box2 has nvcr.io/nvidia/pytorch:24.03-py3\n").images_differ
    assert log("multinode stuck at init, node1 has torch 1.13 node2 torch 2.0\n").torch_versions_differ is True
    assert log("一台是 torch 1.13.1+cu117，另一台是 torch 2.0.1+cu118\n").torch_versions_differ is True
    assert log("torch 2.1.0 and torch 2.1.0 on both nodes\n").torch_versions_differ is False
    assert log("torch 2.1.0, torchvision 0.16.0\n").torch_versions_differ is False
    # several on a line that names no nodes compare releases over time, not the nodes' own
    assert log("it run well in torch 1.8.1, but get hang in torch 1.10.2 and 1.11.0\n").torch_versions_differ is False
    # enroot/pyxis name the registry apart with '#'
    assert log("a: nvcr.io#nvidia/pytorch:23.10-py3\nb: nvcr.io#nvidia/pytorch:24.03-py3\n").images_differ is True


def test_one_library_line_quoted_at_two_line_numbers_is_two_releases():
    def log(text: str):
        return offline_facts(logs=[("log", text.splitlines(True))]).log

    frame = '  File "/{env}/lib/python3.10/site-packages/lightning/pytorch/loops/fit_loop.py", line {no}, in advance\n'
    code = "    self.epoch_loop.run(self._data_fetcher)\n"
    two = frame.format(env="a", no=359) + code + "node b:\n" + frame.format(env="b", no=375) + code
    assert log(two).library_code_skew is True
    # the same release in two environments, and two statements of one function, are one release
    assert log(two.replace("375", "359")).library_code_skew is False
    other = frame.format(env="b", no=375) + "    self.advance(data_fetcher)\n"
    assert log(frame.format(env="a", no=359) + code + other).library_code_skew is False
    # ranks' prefixes and elided paths compare too; user code never does
    ranked = (
        f"[rank0]:{frame.format(env='a', no=359)}[rank0]:{code}[rank4]:{frame.format(env='b', no=375)}[rank4]:{code}"
    )
    assert log(ranked).library_code_skew is True
    mine = '  File "/home/me/train.py", line 3, in main\n    fit()\n  File "/home/me/train.py", line 9, in main\n    fit()\n'
    assert log(mine).library_code_skew is None
    # torch's C++ log: one message at two positions of its source, whatever the rank and numbers
    old = (
        "[E ProcessGroupNCCL.cpp:{no}] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={r})\n"
    )
    assert log(old.format(no=563, r=2) + old.format(no=475, r=5)).library_code_skew is True
    new = "[E1104 09:12:03.551201 140 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:563] [PG 0 Rank 7] Watchdog caught collective operation timeout\n"
    assert log(old.format(no=563, r=2) + new).library_code_skew is False


def test_a_job_on_several_nodes_is_one_fact_however_it_is_shown():
    def multi(text: str) -> bool | None:
        return offline_facts(logs=[("log", text.splitlines(True))]).launcher.multi_node

    assert multi("torchrun --nnodes=2 --nproc_per_node=8 train.py\n") is True
    assert multi("#SBATCH --nodes=4\nsrun python train.py\n") is True
    # a config's key; a graph's num_nodes (thousands) is no node count
    assert multi("trainer:\n  devices: 4\n  num_nodes: 2\n") is True
    assert multi("compute_environment: LOCAL_MACHINE\nnum_machines: 2\n") is True
    # the key quoted in a sentence, the sentence going on
    assert multi("accelerate config says num_machines: 2 but I run it on one box\n") is True
    assert multi("Data(x=[2708, 1433], num_nodes: 2708)\n") is None
    assert (
        multi(
            "gpu-a01:3312:3312 [0] NCCL INFO Bootstrap : Using ib0:10.20.0.5<0>\n"
            "gpu-a02:9120:9120 [0] NCCL INFO Bootstrap : Using ib0:10.20.0.6<0>\n"
        )
        is True
    )
    assert multi("our 2-node job hangs at the first all_reduce\n") is True
    assert multi("torchrun --nnodes=1 --nproc_per_node=8 train.py\n") is False
    # SLURM's allocation is where the job runs: a Trainer asking for more nodes gets none
    assert multi("#SBATCH --nodes=1 --ntasks-per-node=4\nTrainer(devices=4, num_nodes=2)\n") is False
    assert multi("RuntimeError: CUDA out of memory\n") is None


def test_a_world_size_stated_beyond_slurms_tasks_is_a_fact():
    def beyond(text: str) -> bool | None:
        return offline_facts(logs=[("log", text.splitlines(True))]).launcher.world_size_beyond_started

    sbatch = "#SBATCH --nodes=1 --ntasks=4 --gres=gpu:4\nsrun python train.py\n"
    assert beyond(sbatch + "the config still says world_size: 16 from the 4-node run\n") is True
    assert beyond(sbatch + "export WORLD_SIZE=4\n") is False
    per_node = "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n"
    assert beyond(per_node + "[rank 0] init_process_group(backend=nccl) world_size=16\n") is True
    assert beyond(per_node + "[rank 0] init_process_group(backend=nccl) world_size=8\n") is False
    # no SLURM tasks, or no number stated: nothing to compare
    assert beyond("torchrun --nproc_per_node=2 train.py --world_size=2\n") is None
    assert beyond(sbatch + "WORLD_SIZE=$SLURM_NTASKS\n") is None


def test_a_command_line_compares_its_processes_with_the_gpus_its_mask_leaves():
    assert (
        _log("CUDA_VISIBLE_DEVICES=1,3 accelerate launch --multi_gpu --num_processes=2 train.py").ranks_vs_visible
        == "equal"
    )
    assert _log("CUDA_VISIBLE_DEVICES=1,2 torchrun --nproc_per_node 4 train.py").ranks_vs_visible == "more_ranks"
    assert _log(
        "CUDA_VISIBLE_DEVICES='2,3' python -m torch.distributed.launch --nproc-per-node=1 x.py"
    ).ranks_vs_visible == ("fewer_ranks")
    # the last command is the one that ran; a misspelt variable masks nothing, so it is no mask
    two = "CUDA_VISIBLE_DEVICES=0 torchrun --nproc_per_node=2 a.py\nCUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node=2 a.py"
    assert _log(two).ranks_vs_visible == "equal"
    assert _log("CUDA_VISIBLE_DEVICE=2,3 tune run --nproc_per_node 6 lora").ranks_vs_visible is None
    assert _log("torchrun --nproc_per_node=4 train.py").ranks_vs_visible is None


def test_ranks_printing_different_shapes_for_one_tensor():
    assert _log("[rank0] boxes torch.Size([112, 4])\n[rank1] boxes torch.Size([87, 4])").shapes_differ_across_ranks
    same = "rank 0: boxes shape (64, 4)\nrank 1: boxes shape (64,4)\nrank 1: logits torch.Size([2, 9])"
    assert _log(same).shapes_differ_across_ranks is False  # one rank's other tensor is no comparison
    assert _log("[rank0] boxes torch.Size([112, 4])").shapes_differ_across_ranks is None


def test_a_store_barrier_counting_more_workers_than_the_world_is_an_earlier_runs_store():
    wait = "Waiting in store based barrier to initialize process group for rank: 0, key: store_based_barrier_key:1 "
    assert _log(wait + "(world_size=6, worker_count=287, timeout=0:30:00)").store_overcounted is True
    assert _log(wait + "(world_size=8, worker_count=7, timeout=0:30:00)").store_overcounted is False
    assert _log("nothing about the store here").store_overcounted is None


def test_a_store_barrier_last_seen_short_of_the_world_with_nothing_formed_after():
    wait = "Waiting in store based barrier to initialize process group for rank: 0, key: store_based_barrier_key:1 "
    short = wait + "(world_size=16, worker_count=8, timeout=0:30:00)"
    assert _log(short + "\n" + short).store_short is True
    formed = "Rank 0: Completed store-based barrier for key:store_based_barrier_key:1 with 16 nodes."
    assert _log(short + "\n" + formed).store_short is False
    assert _log("nothing about the store here").store_short is None


def test_slurm_tasks_short_of_the_devices_asked_for():
    def short(text: str) -> bool | None:
        return offline_facts(logs=[("log", text.splitlines(True))]).launcher.slurm_tasks_short_of_devices

    lightning = "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\nsrun python train.py\nTrainer(devices=4)\n"
    assert short(lightning) is True
    assert short(lightning.replace("ntasks-per-node=1", "ntasks-per-node=4")) is False
    # torchrun in each task starts the node's ranks itself: one task per node is the layout
    assert short("#SBATCH --ntasks-per-node=1\nsrun torchrun --nproc_per_node=4 train.py\n") is None


@pytest.mark.parametrize(
    "text, gpu",
    [
        # a variable's name joins NCCL or CUDA to its prefix with "_"
        ("we had TORCH_NCCL_ASYNC_ERROR_HANDLING set to 0\n", True),
        ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n", True),
        ("GPU available: False, used: False\n", False),
        ("the job stops after an hour\n", False),
    ],
)
def test_a_log_that_names_nccl_or_cuda_is_a_job_on_gpus(text, gpu):
    assert _log(text).mentions_gpu is gpu
