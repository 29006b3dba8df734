"""probes.hang beyond the stacks: the Flight Recorder read as sequences, the job's own source
read for rank-only branches, the first failing rank's traceback, spawned ranks."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from probes.facts import Collective, Frame, RankStack
from probes.hang import (
    find_ranks,
    first_failure,
    rank_branch,
    rank_zero_calls,
    read_flight_recorder,
    sequence,
    slow_ranks,
    tracebacks,
)
from probes.log import log_from_text
from probes.runner import kill_tree

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hang"
W, B = ("all_reduce", [[4, 4]]), ("all_reduce", [[4]])  # one training step: weight, then bias gradients


def ops(*calls: tuple[str, list[list[int]]]) -> list[Collective]:
    return [Collective(seq=i, op=op, sizes=sizes, pg="default_pg") for i, (op, sizes) in enumerate(calls, 1)]


STEPS = [W, B] * 3


@pytest.mark.parametrize(
    ("per_rank", "stacks", "expected"),
    [
        ({0: ops(*STEPS, W), 1: ops(*STEPS, ("barrier", [[1]]))}, [], "uneven-iterations"),
        ({0: ops(*STEPS, W), 1: ops(*STEPS)}, [RankStack(rank=1, activity="exited")], "uneven-iterations"),
        ({0: ops(*STEPS, W), 1: ops(*STEPS)}, [RankStack(rank=1, activity="compute")], "rank-behind"),
        ({0: ops(*STEPS, ("all_gather", [[10]])), 1: ops(*STEPS, ("all_gather", [[11]]))}, [], "size-mismatch"),
        ({0: ops(*STEPS, ("all_gather", [[10]])), 1: ops(*STEPS, ("broadcast", [[1]]))}, [], "different-ops"),
        ({0: ops(*STEPS, W), 1: ops(*STEPS, W)}, [], "in-step"),
        ({0: ops(("barrier", [[1]])), 1: []}, [], "rank-behind"),  # rank 1 dumped, but issued nothing yet
        ({0: [], 1: []}, [], None),
    ],
    ids=[
        "one-more-step",
        "the-other-exited",
        "the-other-is-busy",
        "size-mismatch",
        "different-ops",
        "in-step",
        "never-started",
        "nothing-recorded",
    ],
)
def test_sequence_names_where_the_ranks_part(per_rank, stacks, expected):
    assert sequence(per_rank, stacks) == expected


def test_a_repeated_op_is_not_a_step_unless_the_ranks_were_just_repeating_it():
    """Lightning broadcasts now and then; a broadcast after validation is no step of the loop."""
    history = [W, B, W, B, ("broadcast", [[1]]), ("all_reduce", [[1]])]
    per_rank = {0: ops(*history, ("all_gather", [[4]])), 1: ops(*history, ("broadcast", [[1]]))}
    assert sequence(per_rank) == "different-ops"


def test_real_flight_recorder_dumps_of_uneven_batches():
    per_rank, _ = read_flight_recorder(FIXTURES / "flight-recorder-uneven")
    assert per_rank[0][0].sizes == [[1, 4]]
    assert sequence(per_rank) == "uneven-iterations"


def test_slow_ranks_are_busy_while_every_other_rank_waits():
    waiting, busy, exited = (
        RankStack(rank=r, activity=a) for r, a in ((1, "collective"), (0, "compute"), (2, "exited"))
    )
    assert slow_ranks([waiting, busy]) == [0]
    assert slow_ranks([waiting, busy, exited]) == []  # an exited rank is another story
    assert slow_ranks([waiting, RankStack(rank=0, activity="collective")]) == []


SOURCE = """\
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_only


class Model:
    def validation_step(self, batch, _):
        loss = batch.sum()
        if self.trainer.is_global_zero:
            self.log("val_loss", loss, sync_dist=True)
            self.log("plain", loss)
        self.log("every_rank", loss, sync_dist=True)


@rank_zero_only
def report(x):
    dist.all_gather_object([None, None], x)


def main(rank):
    if rank == 0:
        print("preparing")
        dist.barrier()
    else:
        dist.broadcast(x, 0)
    dist.all_reduce(x)
"""


def test_rank_zero_calls_are_read_from_the_source(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    found = [(c.line, c.call, c.condition) for c in rank_zero_calls([str(path)])]
    assert sorted(found) == [
        (9, "self.log", "if self.trainer.is_global_zero:"),
        (16, "dist.all_gather_object", "@rank_zero_only"),
        (22, "dist.barrier", "if rank == 0:"),
        (24, "dist.broadcast", "if rank == 0:"),  # the else branch is taken by some ranks only, too
    ]


def test_rank_branch_of_a_stack_is_its_innermost_user_frame_in_one(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    in_branch = [Frame(file=c10d, line=1, function="barrier"), Frame(file=str(path), line=22, function="main")]
    outside = [Frame(file=c10d, line=1, function="all_reduce"), Frame(file=str(path), line=25, function="main")]
    assert rank_branch(in_branch) == "if rank == 0:"
    assert rank_branch(outside) is None
    assert rank_branch([Frame(file=str(tmp_path / "gone.py"), line=3)]) is None
    (tmp_path / "broken.py").write_text("def (:\n")
    assert rank_zero_calls([str(tmp_path / "broken.py")]) == []


LOG = """\
W1124 torch/distributed/run.py Setting OMP_NUM_THREADS
[rank1]: Traceback (most recent call last):
[rank0]: Traceback (most recent call last):
[rank1]:   File "/job/train.py", line 14, in <module>
[rank1]:     warmup = CONFIGS[rank]["warmup"]
[rank0]:   File "/job/train.py", line 16, in <module>
[rank0]:     dist.all_reduce(torch.ones(1))
[rank1]: KeyError: 'warmup'
[rank0]: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1935
"""


def test_tracebacks_are_split_by_rank_prefix_in_the_order_they_end():
    blocks = tracebacks(LOG.splitlines())
    assert [(rank, block[-1]) for rank, block in blocks] == [
        (1, "KeyError: 'warmup'"),
        (0, "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1935"),
    ]


def test_first_failure_reads_that_ranks_exception_through_the_catalog():
    failure = first_failure(LOG.splitlines(), 1, log_from_text)
    assert (failure.rank, failure.exception, failure.message) == (1, "KeyError", "'warmup'")
    assert failure.user_frame == Frame(file="/job/train.py", line=14, function="<module>")
    assert failure.explained is False  # "a KeyError" names no cause: the cascade stays the answer
    # the source line quoted in a traceback is the user's text, not an error: it is not read
    quoted = 'Traceback (most recent call last):\n  File "/job/t.py", line 3, in f\n    raise ValueError("CUDA out of memory")\nValueError: bad shard'
    assert first_failure(quoted.splitlines(), None, log_from_text).signatures == ["python_exception"]


def test_first_failure_of_a_process_aborted_by_a_cpp_exception():
    log = [
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'",
        "  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 22 vs 20. Received data size doesn't match expected size.",
        *(line for line in LOG.splitlines() if line.startswith("[rank1]")),
    ]
    # torchrun names rank 0 first; its only trace is the abort, which no rank prefix marks
    failure = first_failure(log, 0, log_from_text)
    assert failure.exception == "gloo::EnforceNotMet"
    assert "Received data size doesn't match expected size" in failure.message


def test_first_failure_names_a_known_error_as_explained():
    log = "[rank0]: Traceback (most recent call last):\n[rank0]: RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This error indicates that your module has parameters that were not used in producing loss."
    failure = first_failure(log.splitlines(), 0, log_from_text)
    assert failure.explained is True and "python_exception" in failure.signatures and len(failure.signatures) > 1


SPAWN = textwrap.dedent("""
    import time
    import torch.multiprocessing as mp

    def work(rank):
        time.sleep(60)

    if __name__ == "__main__":
        mp.spawn(work, nprocs=2)
""")


def test_ranks_started_by_spawn_are_found_in_start_order(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "spawn.py"
    script.write_text(SPAWN)
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(psutil.Process(proc.pid).children()) < 2:
            time.sleep(0.1)
        time.sleep(0.5)
        ranks = find_ranks(proc.pid)
        children = sorted(psutil.Process(proc.pid).children(), key=lambda p: (p.create_time(), p.pid))
        spawned = [p for p in children if "spawn_main" in " ".join(p.cmdline())]
        assert [(r.pid, r.rank) for r in ranks] == [(p.pid, i) for i, p in enumerate(spawned)]
        assert len(ranks) == 2
    finally:
        kill_tree(proc.pid)
