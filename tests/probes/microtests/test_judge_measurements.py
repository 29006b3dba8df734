"""The measurement names rules may test (probes.facts.MEASUREMENTS) are the names the judge fills."""

from probes.facts import MEASUREMENTS
from probes.microtests.channel import RankReport
from probes.microtests.checks import SIZES, size_label
from probes.microtests.judge import measure


def test_the_sweep_sizes_are_the_ones_the_names_cover():
    sizes = {size_label(s) for s in SIZES}
    assert {f"busbw_gbps_{s}" for s in sizes} <= MEASUREMENTS["all_reduce"]


def test_every_measurement_the_judge_fills_is_a_name_rules_may_use():
    timings = {f"time_s_{size_label(s)}": 0.001 for s in SIZES}
    reports = {
        0: RankReport(
            measurements={
                "init_s": 0.1,
                "first_collective_s": 0.2,
                "barrier_s": 0.1,
                **timings,
                "device_uuid": "GPU-a",
                "nccl_error": None,
            },
            done=True,
            steps=["barrier"],
        ),
        1: RankReport(
            measurements={
                "init_s": 0.1,
                "first_collective_s": 0.2,
                "barrier_s": 0.1,
                **timings,
                "device_uuid": "GPU-b",
            },
            done=True,
            steps=["barrier"],
        ),
    }
    for name in ("rendezvous", "barrier", "all_reduce", "duplicate_gpu"):
        for status in ("passed", "failed"):
            assert set(measure(name, reports, 2, status, "Connection refused")) <= MEASUREMENTS[name], name
    assert set(measure("duplicate_gpu", reports, 2, "passed", extra={"shared": True})) <= MEASUREMENTS["duplicate_gpu"]


def test_the_placement_summary_uses_the_names_rules_may_use():
    from probes.microtests.checks import placement_summary

    summary = placement_summary([(10, 0), (11, 1)], {0: {10, 11}, 1: {11}})
    assert summary["foreign_ranks_on_gpu0"] == 1
    assert set(summary) <= MEASUREMENTS["placement"]
