"""What happened, named from the facts: the most specific symptom the facts show."""

from probes.offline import offline_facts
from probes.symptoms import observe


def _observed(text: str) -> dict[str, list[str]]:
    return observe(offline_facts(logs=[("log", text.splitlines(True))]))


def test_a_vague_symptom_gives_way_to_the_specific_one_and_hands_on_its_sources():
    seen = _observed(
        "NCCL timeout at the end of the first epoch\n"
        "[E ProcessGroupNCCL.cpp:587] [Rank 2] Watchdog caught collective operation timeout: "
        "WorkNCCL(OpType=BROADCAST, Timeout(ms)=1800000) ran for 1802157 milliseconds before timing out.\n"
    )
    assert "timeout" not in seen
    assert "log user_timeout" in seen["timeout.collective"]
    assert "log nccl_watchdog_timeout" in seen["timeout.collective"]


def test_a_vague_symptom_alone_stays():
    assert set(_observed("the job hangs, no error\n")) == {"hang"}


def test_two_refinements_of_one_symptom_both_stay():
    seen = _observed("training is stuck at init\nthe other ranks wait in all_reduce: NCCL all_reduce timed out\n")
    assert "hang.init" in seen and "timeout.collective" in seen and "hang" not in seen


_STARTED = (
    "2022-02-10 10:40:23 | INFO | fairseq.distributed_utils | distributed init (rank 0): tcp://localhost:17995\n"
    "2022-02-10 10:40:24 | INFO | torch.distributed.distributed_c10d | Rank 0: Completed store-based barrier "
    "for key:store_based_barrier_key:1 with 2 nodes.\n"
)


def test_a_log_that_ends_after_start_up_without_an_error_has_stopped_at_the_first_collective():
    assert _observed(_STARTED) == {"hang.collective": ["log ends after start-up, with no error"]}
    assert _observed("initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2\n") == {
        "hang.collective": ["log ends after start-up, with no error"]
    }


def test_start_up_followed_by_an_error_or_by_training_is_no_stop():
    assert "hang.collective" not in _observed(_STARTED + "RuntimeError: CUDA error: out of memory\n")
    steps = "".join(f"Epoch 0: {i}%|##| {i}/100 [00:{i:02d}<00:10, loss=0.5]\n" for i in range(10, 100, 10))
    assert _observed(_STARTED + steps) == {}


_OUT_OF_DATA = "".join(
    f"2023-04-13 16:00:05,6{r}1 INFO [trainer.py:650] ({r}/8) Reaches end of dataloader.\n"
    f"2023-04-13 16:00:05,6{r}2 INFO [trainer.py:626] ({r}/8) Computing validation loss\n"
    for r in (5, 7, 4)
)


def _log(text: str):
    return offline_facts(logs=[("log", text.splitlines(True))]).log


def test_a_log_that_ends_as_ranks_run_out_of_data_is_a_hang_in_a_collective():
    assert _observed(_OUT_OF_DATA) == {"hang.collective": ["log ends as ranks run out of data, with no error"]}
    assert _log(_OUT_OF_DATA).ends_out_of_data is True  # the fact sync.uneven-batches weighs
    # the job went on (validation done, the next epoch's steps): no stop
    later = "".join(f"INFO [trainer.py:700] (0/8) Epoch 2, batch {i}, loss[loss=3.1]\n" for i in range(0, 200, 20))
    assert _observed(_OUT_OF_DATA + later) == {}
    assert _log(_OUT_OF_DATA + later).ends_out_of_data is False
    assert "hang.collective" not in _observed(_OUT_OF_DATA + "RuntimeError: CUDA error: out of memory\n")


def test_an_error_of_no_known_kind_is_still_a_failure():
    assert set(_observed("Traceback (most recent call last):\nKeyError: 'labels'\n")) == {"crash"}
    assert set(_observed("accelerate多卡训练出错。\n")) == {"crash"}
    assert set(_observed("I got the following error when training with 2 GPUs\n")) == {"crash"}


def test_an_error_of_no_known_kind_gives_way_to_any_other_symptom():
    assert set(_observed("it hangs, then I got the following error\nKeyError: 'labels'\n")) == {"hang"}
    assert set(_observed("卡住了，没有报错\n")) == {"hang"}
    assert _observed("the run finished; no error message\n") == {}


def test_a_reader_saying_it_does_not_work_over_a_log_that_stops_after_start_up_is_that_stop():
    assert _observed("multi-gpu training does not work\n" + _STARTED) == {
        "hang.collective": ["log ends after start-up, with no error"]
    }


def test_a_hang_over_a_log_that_ends_while_the_group_forms_is_a_hang_at_start_up():
    banner = "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/1\n"
    deepspeed = "[INFO] [comm.py:668:init_distributed] Initializing TorchBackend in DeepSpeed with backend nccl\n"
    for joining in (banner, deepspeed):
        seen = _observed("training gets stuck\n" + joining)
        assert seen == {"hang.init": ["log user_hang", "log ends while the process group forms"]}
        assert offline_facts(logs=[("log", ["x\n", joining])]).log.ends_joining_group is True
    # the group formed (Lightning's registration line), or a failure followed: no stop in joining
    registered = "All distributed processes registered. Starting with 2 processes\n"
    assert set(_observed("training gets stuck\n" + banner + registered)) != {"hang.init"}
    assert offline_facts(logs=[("log", [banner, registered])]).log.ends_joining_group is False
    assert (
        offline_facts(
            logs=[("log", [banner, "Traceback (most recent call last):\n", "KeyError: 'x'\n"])]
        ).log.ends_joining_group
        is False
    )
    # far past the banner (training ran), the log no longer ends there
    steps = [f"step {i} loss=0.5\n" for i in range(20)]
    assert offline_facts(logs=[("log", [banner, *steps])]).log.ends_joining_group is False


def test_a_group_of_fewer_ranks_than_devices_asked_for_is_gpus_missing():
    seen = _observed("trainer = L.Trainer(devices=4)\nInitializing distributed: GLOBAL_RANK: 0, MEMBER: 1/1\n")
    assert seen["gpus-missing"] == ["fewer ranks formed the group than devices were requested"]
    assert "gpus-missing" not in _observed(
        "trainer = L.Trainer(devices=2)\nInitializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2\n"
    )


def test_a_rank_the_launcher_reports_dead_is_a_rank_exited_whatever_its_signal():
    line = "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -7) local_rank: 0 (pid: 12) of binary: /usr/bin/python\n"
    assert _observed(line)["crash.rank-exited"] == ["a rank ended with exit code -7"]
    assert "crash.rank-exited" not in _observed("[launch.py:351:main] Process 4242 exits successfully.\n")


def test_lightnings_no_gpu_banner_is_a_missing_gpu_only_in_a_job_that_names_gpus():
    banner = "GPU available: False, used: False\nTPU available: False, using: 0 TPU cores\n"
    assert _observed(banner) == {}  # what a healthy CPU run prints
    assert "gpus-missing" in _observed("Trainer(accelerator='gpu', devices=4) on 4 GPUs\n" + banner)
