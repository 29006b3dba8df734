"""The causes the rule base did not know (../shared/uncovered-causes.md), read from their public
threads as the reporters posted them: the rule written for each must rank among the first.

Only text the threads show is used (title and first post, or the log line quoted in the
thread). Threads whose post holds nothing a rule could key on are not here: the failing power
cable of pytorch#85334 and the faulty board of DeepSpeed#5766 (hardware.gpu-fault and
hardware.node-fault need the kernel log or a pairwise test), the port range of wenet#1490
(found only with NCCL_DEBUG=INFO, which the post does not include), and the int8 path of
Matrix-Game#72 (documented in docs/rule-format.md as not a rule).
"""

from __future__ import annotations

import pytest

import diagnose

THREADS = {
    # Lightning-AI/pytorch-lightning#8139
    "ddp.lightning-non-consecutive-gpus": (
        1,
        """DDP and gpus=[1,2,3] causes NCCL error
On a machine with 4 GPUs, using DDP and `gpus=[1,2,3]` results in an NCCL error:
RuntimeError: NCCL error in: /opt/conda/conda-bld/pytorch_1614378062065/work/torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled system error, NCCL version 2.7.8
ncclSystemError: System call (socket, malloc, munmap, etc) failed.
For `[0,2]`, `[0,3]`, `[0,1,3]`, and `[0,2,3]`, the execution hangs.
""",
    ),
    # NVIDIA/nccl#328
    "nccl.shm-not-writable": (
        1,
        """RuntimeError: NCCL error in ProcessGroupNCCL.cpp:290, unhandled system error
node08:27106:27302 [0] include/shm.h:27 NCCL WARN Call to shm_open failed : Permission denied
node08:27106:27302 [0] NCCL INFO include/shm.h:41 -> 2
node08:27106:27302 [0] include/shm.h:48 NCCL WARN Error while creating shared memory segment nccl-shm-recv-b7948f403864987a-0-3-0 (size 4460544)
""",
    ),
    # NVIDIA/nccl#238
    "nccl.buggy-release": (
        1,
        """NCCL hang on socket recv()
When I run nccl 2.4.2 across multiple nodes, the program hangs randomly. `nvidia-smi` shows the GPU utility is always 100%.
""",
    ),
    # karpathy/nanoGPT#236
    "oom.resume-checkpoint-copy": (
        1,
        """fix "cuda out of memory" when resuming training
When training a large model that takes up almost the entire memory capacity of my GPU, I am unable to resume training from a checkpoint (despite being able to initialize and train the model from scratch), because CUDA keeps running out of memory.
torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB
GPU 0; 8.00 GiB total capacity; 7.20 GiB already allocated; 0 bytes free; 7.30 GiB reserved in total by PyTorch
""",
    ),
    # open-mmlab/mmdetection#8940
    "launch.mpirun-local-rank": (
        2,
        """LOCAL_RANK wrong for mpirun
RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cuda:1!
the job to be terminated. The first process to do so was
  Process name: [[8472,1],2]
  Exit code:    1
""",
    ),
    # OptimalScale/LMFlow#406
    "startup.offline-hub-lookup": (
        2,
        """It toke too much time in "Initializing TorchBackend in DeepSpeed with backend nccl " this step!
I work it in docker contrainer,  CMD:  docker run --gpus all --shm-size=512g xxxx
It will stuck  "Initializing TorchBackend in DeepSpeed with backend nccl "  this step for almost 10 minutes.
But it can runs normally after this.
My HPC is 8*A100 SXM.
""",
    ),
    # s-JoL/Open-Llama#47: the post shows only the other ranks waiting; the tracker is named in
    # the fix, so the rule is a candidate of the hang, not yet a finding
    "startup.tracker-blocks-rank": (
        3,
        """train_lm.py一直waiting是为什么？
I0510 07:28:04.417845 139863945226048 distributed_c10d.py:337] Waiting in store based barrier to initialize process group for rank: 2, key: store_based_barrier_key:2 (world_size=8, worker_count=7, timeout=0:30:00)
I0510 07:28:04.428285 140051304576832 distributed_c10d.py:337] Waiting in store based barrier to initialize process group for rank: 7, key: store_based_barrier_key:2 (world_size=8, worker_count=7, timeout=0:30:00)
""",
    ),
}

KB = diagnose.load_kb()


@pytest.mark.parametrize("rule_id", sorted(THREADS))
def test_the_threads_cause_ranks_among_the_first(rule_id):
    within, text = THREADS[rule_id]
    report = diagnose.evaluate(diagnose.offline_facts(log=text), KB)
    ranked = [f.id for f in report.findings]
    assert rule_id in ranked[:within], f"{rule_id} not in the first {within}: {ranked[:5]}"


def test_a_thread_without_the_causes_evidence_does_not_name_it():
    """The same NCCL system error with /dev/shm too small is not a permissions problem."""
    text = (
        "misc/shmutils.cc:71 NCCL WARN Error: failed to extend /dev/shm/nccl-fjwOOB to 5967876 bytes\n"
        "misc/shmutils.cc:112 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-fjwOOB (size 5967872)\n"
    )
    ranked = [f.id for f in diagnose.evaluate(diagnose.offline_facts(log=text), KB).findings]
    assert ranked[0] == "nccl.shm-too-small" and "nccl.shm-not-writable" not in ranked[:2]
