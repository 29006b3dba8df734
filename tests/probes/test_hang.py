"""probes.hang: where a stack waits, py-spy and faulthandler dumps, Flight Recorder dumps,
and the ranks of a real process tree. Recorded dumps come from real hung gloo jobs."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from probes.facts import Frame
from probes.hang import (
    HOOK_DIR,
    HOOK_SIGNAL,
    StackError,
    classify,
    faulthandler_stack,
    find_ranks,
    is_library,
    parse_faulthandler,
    parse_pyspy,
    pyspy_stack,
    rank_stack,
    read_flight_recorder,
    spin_signature,
    user_frame,
)
from probes.runner import Result, kill_tree

FIXTURES = Path(__file__).parent.parent / "fixtures" / "hang"
SITE = "/venv/lib/python3.11/site-packages/"


def frames(*specs: tuple[str, str]) -> list[Frame]:
    return [Frame(file=file, line=1, function=function) for file, function in specs]


USER = ("/home/me/train.py", "main")


@pytest.mark.parametrize(
    ("stack", "expected"),
    [
        ([(SITE + "torch/distributed/distributed_c10d.py", "barrier"), USER], "barrier"),
        (
            [
                (SITE + "torch/distributed/distributed_c10d.py", "all_reduce"),
                (SITE + "torch/distributed/c10d_logger.py", "_exception_logger.<locals>.wrapper"),
                USER,
            ],
            "all_reduce",
        ),
        (
            [
                (SITE + "torch/distributed/utils.py", "_verify_param_shape_across_processes"),
                (SITE + "torch/nn/parallel/distributed.py", "DistributedDataParallel.__init__"),
                USER,
            ],
            "verify_params",
        ),
        ([(SITE + "torch/distributed/utils.py", "_sync_params_and_buffers"), USER], "broadcast"),
        (
            [
                (SITE + "torch/distributed/rendezvous.py", "_create_c10d_store"),
                (SITE + "torch/distributed/distributed_c10d.py", "init_process_group"),
                USER,
            ],
            "rendezvous",
        ),
        ([(SITE + "torch/distributed/distributed_c10d.py", "_new_process_group_helper"), USER], "init_process_group"),
        ([(SITE + "lightning/fabric/strategies/ddp.py", "DDPStrategy.barrier"), USER], "barrier"),
        (
            [
                (SITE + "torch/utils/data/dataloader.py", "_MultiProcessingDataLoaderIter._get_data"),
                (SITE + "torch/utils/data/dataloader.py", "__next__"),
                USER,
            ],
            "dataloader",
        ),
        (
            [
                (SITE + "safetensors/torch.py", "load_file"),
                (SITE + "transformers/modeling_utils.py", "PreTrainedModel.from_pretrained"),
                USER,
            ],
            "load",
        ),
        ([(SITE + "torch/serialization.py", "_load"), (SITE + "torch/serialization.py", "load"), USER], "load"),
        ([(SITE + "torch/cuda/__init__.py", "synchronize"), USER], "cuda_sync"),
        ([(SITE + "deepspeed/__init__.py", "initialize"), USER], "deepspeed_initialize"),
        ([("<frozen importlib._bootstrap>", "_find_and_load"), USER], "import"),
        (
            [
                (SITE + "torch/_dynamo/utils.py", "<module>"),
                ("<frozen importlib._bootstrap>", "_call_with_frames_removed"),
                USER,
            ],
            "import",
        ),
        ([USER], "user_code"),
        ([(SITE + "numpy/core/numeric.py", "convolve"), USER], "other"),
        ([], None),
    ],
)
def test_classify_names_the_innermost_recognised_wait(stack, expected):
    assert classify(frames(*stack)) == expected


def test_waiting_in_fits_the_kb_hang_patterns():
    """The seed rules match ``waiting_in`` with these patterns: the vocabulary must fit them."""
    import re

    assert re.search(r"(?i)barrier|wait_for_everyone", "barrier")
    assert re.search(r"(?i)load|from_pretrained|deepspeed|initiali", "load")
    assert re.search(r"(?i)load|from_pretrained|deepspeed|initiali", "deepspeed_initialize")
    assert re.search(r"(?i)_verify_param|verify_params", "verify_params")
    assert not re.search(r"(?i)barrier|wait_for_everyone", "user_code")


def test_spin_signature_needs_a_rank_waiting_on_its_peers_and_tracks_where_each_is():
    waiting = rank_stack(frames((SITE + "torch/distributed/distributed_c10d.py", "all_reduce"), USER), pid=1)
    computing = rank_stack(frames(USER), pid=2)
    moved = rank_stack([Frame(file=USER[0], line=2, function="main")], pid=2)
    assert spin_signature([computing]) is None  # a busy rank in its own code is working
    assert spin_signature([waiting, computing]) == spin_signature([computing, waiting])
    # the ranks waiting for a slow one stay put while it moves: still stuck, as far as they go
    assert spin_signature([waiting, computing]) == spin_signature([waiting, moved])
    waiting_elsewhere = rank_stack(frames((SITE + "torch/distributed/distributed_c10d.py", "barrier"), USER), pid=1)
    assert spin_signature([waiting, computing]) != spin_signature([waiting_elsewhere, computing])
    # at start-up, waiting in rendezvous for a rank that is still importing is no hang
    at_start = rank_stack(frames((SITE + "torch/distributed/rendezvous.py", "_create_c10d_store"), USER), pid=1)
    importing = rank_stack(frames(("<frozen importlib._bootstrap>", "_find_and_load"), USER), pid=2)
    assert spin_signature([at_start, computing]) is None
    assert spin_signature([waiting, importing]) is None
    assert spin_signature(
        [at_start, rank_stack(frames((SITE + "torch/distributed/rendezvous.py", "_create_c10d_store"), USER), pid=2)]
    )


def test_user_frame_skips_libraries_and_stdlib():
    stack = frames(
        (SITE + "torch/distributed/distributed_c10d.py", "barrier"),
        ("/usr/lib/python3.11/threading.py", "wait"),
        ("/home/me/project/data.py", "prepare"),
        ("/home/me/project/train.py", "main"),
    )
    assert user_frame(stack).file == "/home/me/project/data.py"
    assert is_library("/usr/lib/python3/dist-packages/yaml/__init__.py")
    assert not is_library("/srv/lib/python3.11-project/train.py")


def test_parse_recorded_pyspy_dumps():
    frames0, state0 = parse_pyspy((FIXTURES / "pyspy_rank0_barrier.json").read_text(), pid=0)
    assert classify(frames0) == "barrier" and state0 == "idle"
    assert (user_frame(frames0).function, user_frame(frames0).line) == ("prepare_data", 13)
    frames1, _ = parse_pyspy((FIXTURES / "pyspy_rank1_sleep.json").read_text(), pid=0)
    assert classify(frames1) == "user_code" and frames1[0].function == "train"


def test_pyspy_refused_ptrace_is_reported_as_refused():
    def refused(argv, timeout):
        return Result(tuple(argv), 1, "", "Error: Permission Denied (os error 13)\nTry running as root", 0.01)

    with pytest.raises(StackError) as err:
        pyspy_stack(123, "py-spy", run=refused)
    assert err.value.refused

    def missing(argv, timeout):
        return Result(tuple(argv), None, "", "", 0.0, error="not found: py-spy")

    with pytest.raises(StackError) as err:
        pyspy_stack(123, "py-spy", run=missing)
    assert not err.value.refused and "not found" in str(err.value)


def test_parse_recorded_faulthandler_dump():
    text = (FIXTURES / "faulthandler_rank0_barrier.txt").read_text()
    stack = parse_faulthandler(text, main_thread=None)
    assert classify(stack) == "barrier"
    assert (user_frame(stack).file.endswith("barrier_rank0.py"), user_frame(stack).line) == (True, 13)


def test_parse_faulthandler_picks_the_main_thread_of_the_latest_dump():
    text = (
        "Thread 0x00000000000000aa (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
        "Current thread 0x00000000000000bb (most recent call first):\n"
        '  File "/home/me/old.py", line 1 in old\n'
        "Current thread 0x00000000000000bb (most recent call first):\n"
        '  File "/home/me/train.py", line 7 in main\n'
        "  <no Python frame>\n"
    )
    assert [f.function for f in parse_faulthandler(text, main_thread=0xBB)] == ["main"]
    assert [f.function for f in parse_faulthandler(text, main_thread=0xAA)] == ["wait"]


def test_flight_recorder_json_dumps_show_the_mismatched_collective():
    per_rank, found = read_flight_recorder(FIXTURES / "flight-recorder-uneven")
    assert sorted(per_rank) == [0, 1]
    assert per_rank[0][-1].op == "all_reduce" and per_rank[1][-1].op == "barrier"
    assert [(s.seq, s.ops) for s in found] == [(9, {"0": "all_reduce", "1": "barrier"})]


def test_flight_recorder_pickles_name_the_missing_rank_and_the_call_site():
    per_rank, found = read_flight_recorder(FIXTURES / "flight-recorder-pickle")
    assert [(s.op, s.seq, s.entered, s.missing) for s in found] == [("broadcast", 2, [0], [1])]
    assert per_rank[0][-1].frame.line == 6


def test_flight_recorder_refuses_pickled_classes(tmp_path):
    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [Boom()]}))
    (tmp_path / "rank1.json").write_text("{not json")
    per_rank, found = read_flight_recorder(tmp_path)
    assert per_rank == {} and found == []
    assert not (tmp_path / "pwned").exists()


# --- real processes ---------------------------------------------------------------------------

_SLEEPER = "import time\nwhile True: time.sleep(0.2)\n"
_PARENT = """
import os, subprocess, sys, time
script = sys.argv[1]
kids = []
for rank in (0, 1):
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank))
    kids.append(subprocess.Popen([sys.executable, "-c", script], env=env))
print("ready", flush=True)
while True: time.sleep(0.2)
"""
# a rank that forks a helper (a DataLoader worker) which inherits its RANK
_RANK_WITH_HELPER = """
import subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.2)"])
while True: time.sleep(0.2)
"""


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_find_ranks_skips_the_launcher_and_inherited_helpers():
    # the comment puts torchrun's module name on the parent's command line, as torchrun has it
    proc = subprocess.Popen(
        [sys.executable, "-c", _PARENT + "# torch.distributed.run", _RANK_WITH_HELPER],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        proc.stdout.readline()
        _wait_for(lambda: len(psutil.Process(proc.pid).children(recursive=True)) == 4)
        ranks = find_ranks(proc.pid)
        assert [(r.rank, r.local_rank) for r in ranks] == [(0, 0), (1, 1)]
        assert {r.pid for r in ranks} == {c.pid for c in psutil.Process(proc.pid).children()}
    finally:
        kill_tree(proc.pid)
        proc.wait()


def test_find_ranks_counts_a_lightning_style_parent_as_rank_zero():
    """Lightning's launcher runs rank 0 in the parent and starts the others with LOCAL_RANK."""
    parent = """
import os, subprocess, sys, time
env = dict(os.environ, LOCAL_RANK="1")
subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.2)"], env=env)
print("ready", flush=True)
while True: time.sleep(0.2)
"""
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, start_new_session=True)
    try:
        proc.stdout.readline()
        expected = [(0, 0, True), (1, 1, False)]
        # the child may still be starting when the parent says ready (a loaded machine, tests
        # running beside it): look again for a while before judging
        deadline = time.monotonic() + 10
        while True:
            seen = [(r.rank, r.local_rank, r.pid == proc.pid) for r in find_ranks(proc.pid)]
            if seen == expected or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert seen == expected
    finally:
        kill_tree(proc.pid)
        proc.wait()


def test_faulthandler_hook_gives_the_stack_without_ptrace(tmp_path):
    """The hook registers faulthandler before user code; the site's own sitecustomize still runs."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['SITE_RAN'] = '1'\n")
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    script = "import os, time\ndef stuck():\n    print(os.environ.get('SITE_RAN'), flush=True)\n    while True: time.sleep(0.2)\nstuck()\n"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(HOOK_DIR), str(site)]),
        DIAGNOSE_HOOK_DIR=str(hook_dir),
        DIAGNOSE_HOOK_SIGNAL=str(HOOK_SIGNAL),
    )
    (tmp_path / "job.py").write_text(script)
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "job.py")], stdout=subprocess.PIPE, env=env, start_new_session=True
    )
    try:
        assert proc.stdout.readline().strip() == b"1"  # the shadowed sitecustomize ran
        _wait_for(lambda: (hook_dir / f"{proc.pid}.json").exists())
        stack = faulthandler_stack(proc.pid, hook_dir)
        assert [f.function for f in stack] == ["stuck", "<module>"]
        assert classify(stack) == "user_code" and proc.poll() is None  # the signal did not kill it
    finally:
        kill_tree(proc.pid)
        proc.wait()


def test_faulthandler_stack_of_a_process_without_the_hook_is_an_error(tmp_path):
    with pytest.raises(StackError, match="did not load the diagnose hook"):
        faulthandler_stack(os.getpid(), tmp_path)


PASTED_PYSPY = """\
job frozen before the first step, py-spy dump on rank 0:
Process 3011: python train.py
Python v3.10.12 (/usr/bin/python3.10)

Thread 0x7F3A2C9FE740 (idle): "MainThread"
    _store_based_barrier (torch/distributed/distributed_c10d.py:1000)
    init_process_group (torch/distributed/distributed_c10d.py:932)
        Arguments:
            backend: "nccl"
    setup_dist (utils/dist.py:41)
    main (train.py:88)
Thread 0x7F3A1C1FE640 (idle): "Thread-1"
    wait (threading.py:320)
[rank1]:Thread 3012 (active): "MainThread"
[rank1]:    all_gather (torch/distributed/distributed_c10d.py:2948)
[rank1]:    _sync_dist (torchmetrics/metric.py:495)
[rank1]:    on_validation_epoch_end (model.py:212)
"""


def test_pasted_pyspy_dumps_are_stacks_of_their_main_threads():
    from probes.hang import pasted_stacks

    first, second = pasted_stacks(PASTED_PYSPY.splitlines())
    assert (first.waiting_in, first.state, first.method) == ("rendezvous", "idle", "py-spy")
    # py-spy prints library paths relative to the import path: the user's frame is the script's
    assert first.user_frame.file == "utils/dist.py"
    assert [f.function for f in first.frames] == ["_store_based_barrier", "init_process_group", "setup_dist", "main"]
    assert second.waiting_in == "all_gather" and second.user_frame.function == "on_validation_epoch_end"
    assert pasted_stacks(['Thread 1 (idle): "MainThread"', "no frames here"]) == []


def test_a_pasted_dump_is_the_offline_hang_and_a_metric_sync_is_named():
    from probes.offline import offline_facts

    hang = offline_facts(logs=[("log", PASTED_PYSPY.splitlines(True))]).hang
    assert hang.waiting_in == ["all_gather", "rendezvous"] and hang.divergent is True
    assert hang.metric_sync_waits is True
    assert (
        offline_facts(logs=[("log", PASTED_PYSPY.split("[rank1]")[0].splitlines(True))]).hang.metric_sync_waits is False
    )
    assert offline_facts(logs=[("log", ["no dump\n"])]).hang.metric_sync_waits is None
