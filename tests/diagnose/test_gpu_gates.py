"""Causes that need a GPU or NCCL are gated on the facts: never a candidate on a CPU job that ran
on gloo, still a candidate when nothing says what the job ran on (unknown is not false).

The gate of each such rule is one ``any:`` over ``gpus.count``, ``torch.cuda_available`` and
``log.mentions_gpu`` (a log naming NCCL, CUDA, the NVIDIA driver or GPUs), so a pasted NCCL error keeps the rule
even when the pasted environment was collected on a machine without GPUs.
"""

from __future__ import annotations

import io

import pytest

from diagnose.engine import evaluate
from diagnose.kb import load_kb
from diagnose.rules import AnyCheck, FactCheck
from probes.facts import Facts
from probes.offline import offline_facts

KB = load_kb()

# Causes that need a GPU or NCCL: none of them may be ranked on a CPU job that ran on gloo (the
# zoo asserts it on real jobs); exactly these rules are gated on the facts.
GPU_OR_NCCL_ONLY = (
    "nccl.",
    "cuda.",
    "devices.",
    "oom.cuda-one-rank",
    "oom.resume-checkpoint-copy",
    "ddp.checkpoint-on-gpu0",
    "ddp.lightning-non-consecutive-gpus",
    "env.driver-too-old",
    "env.gpu-arch-unsupported",
    "env.mixed-gpu-models",
    "env.no-nccl-windows",
    "env.cudnn-mismatch",
    "env.cpu-only-torch",
    "sync.watchdog-disabled",
    "startup.staggered-init-hang",
    "hardware.gpu-fault",
    "launch.mpirun-local-rank",
    "cluster.nccl-env-mismatch",
    "cluster.driver-mismatch",
    "cluster.gpu-model-mismatch",
    "cluster.tasks-vs-gpus",
)
NO_EVIDENCE = "none of its evidence was seen"

# what a 2-rank gloo job on CPU printed when one rank stopped in a barrier and the other in an
# all_reduce, then timed out (tests/zoo/jobs/gloo_timeout_fires.py, trimmed)
GLOO_JOB_LOG = """\
GPU available: False, used: False
Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2
[rank0]: Traceback (most recent call last):
[rank0]:   File "train.py", line 31, in <module>
[rank0]:     dist.all_reduce(t)
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 2000ms for recv operation to complete
The job hangs: rank 1 is stuck in barrier()
"""


def gpu_gated(rule) -> bool:
    """Whether the rule's `when` holds only where a GPU, CUDA or NCCL is in play."""
    for check in rule.when:
        if isinstance(check, FactCheck) and check.fact == "gpus.count" and check.op == "ge":
            return True
        if isinstance(check, AnyCheck) and {c.fact for c in check.any if isinstance(c, FactCheck)} >= {
            "gpus.count",
            "torch.cuda_available",
        }:
            return True
    return False


def gated_out(facts: Facts) -> set[str]:
    """Rules whose `when` failed on these facts."""
    return {o.id for o in evaluate(facts, KB).ruled_out if o.reason != NO_EVIDENCE}


def log_facts(text: str, report: str | None = None) -> Facts:
    reports = [("env.txt", report)] if report is not None else []
    return offline_facts(reports=reports, logs=[("train.log", io.StringIO(text))])


def cpu_gloo_job() -> Facts:
    facts = log_facts(GLOO_JOB_LOG)
    facts.gpus.count = 0
    facts.torch.cuda_available, facts.torch.backends = False, ["gloo"]
    return facts


def test_the_gpu_gated_rules_are_exactly_the_gpu_or_nccl_only_causes():
    gated = {r.id for r in KB.rules if gpu_gated(r)}
    listed = {r.id for r in KB.rules if r.id.startswith(GPU_OR_NCCL_ONLY)}
    assert gated == listed, f"gated, not listed: {sorted(gated - listed)}; listed, not gated: {sorted(listed - gated)}"


def test_no_gpu_or_nccl_cause_is_a_candidate_on_a_cpu_gloo_job():
    facts = cpu_gloo_job()
    report = evaluate(facts, KB)
    assert facts.symptoms, "the job's log shows a hang and a timeout: candidates are weighed"
    wrong = [f.id for f in report.findings if f.id.startswith(GPU_OR_NCCL_ONLY)]
    assert wrong == []
    assert {r.id for r in KB.rules if gpu_gated(r)} <= gated_out(facts)


def test_unknown_is_not_false_an_offline_paste_keeps_every_gpu_cause():
    facts = log_facts(GLOO_JOB_LOG.replace("GPU available: False, used: False\n", ""))
    assert facts.gpus.count is None and facts.torch.cuda_available is None
    assert not {r.id for r in KB.rules if gpu_gated(r)} & gated_out(facts)


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:219, unhandled system error",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
    ],
)
def test_a_log_that_names_nccl_or_cuda_keeps_the_gate_open_where_the_report_saw_no_gpu(line):
    # the environment was collected on a login node; the log is the GPU job's
    facts = log_facts(line + "\n")
    facts.gpus.count, facts.torch.cuda_available = 0, False
    # rules that need two GPUs, or a launcher or release the log does not show, stay gated by that
    open_gate = {r.id for r in KB.rules if gpu_gated(r) and len(r.when) == 1 and isinstance(r.when[0], AnyCheck)}
    assert len(open_gate) > 20 and not open_gate & gated_out(facts)


# A Lightning job on a GPU host that chose gloo (a CPU process group beside GPU tensors), as its
# banner prints it, hanging mid-epoch: the host has GPUs, so the GPU gates are open, but NCCL's
# causes cannot be the job's (the rules weigh log.backend against them)
GPU_HOST_GLOO_LOG = """\
Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2
----------------------------------------------------------------------------------------------------
distributed_backend=gloo
All distributed processes registered. Starting with 2 processes
----------------------------------------------------------------------------------------------------
Epoch 0:  45%|████▌     | 45/100 [00:12<00:15,  3.61it/s, loss=0.412]
The job hangs here: both GPUs show 0% utilisation and nothing is printed any more.
"""


def gpu_host(text: str) -> Facts:
    facts = log_facts(text)
    facts.gpus.count, facts.torch.cuda_available = 2, True
    return facts


def test_a_gloo_job_on_a_gpu_host_gets_no_nccl_cause():
    facts = gpu_host(GPU_HOST_GLOO_LOG)
    assert facts.log.backend == "gloo"
    findings = [f.id for f in evaluate(facts, KB).findings]
    assert findings, "the hang is still weighed"
    assert not [i for i in findings if i.startswith("nccl.")]


def test_the_same_hang_under_nccl_keeps_nccl_causes():
    facts = gpu_host(GPU_HOST_GLOO_LOG.replace("distributed_backend=gloo", "distributed_backend=nccl"))
    assert facts.log.backend == "nccl"
    assert [f.id for f in evaluate(facts, KB).findings if f.id.startswith("nccl.")]
