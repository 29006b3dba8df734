"""What the ranks compute that needs no rank: the sweep and the placement summary."""

from probes.microtests.checks import SIZES, iterations, placement_summary, size_label


def test_the_sweep_runs_from_1KB_to_64MB():
    assert [size_label(s) for s in (SIZES[0], SIZES[-1])] == ["1KB", "64MB"]
    assert all(b == 4 * a for a, b in zip(SIZES, SIZES[1:], strict=False))
    assert iterations(1024) == (2, 20) and iterations(64 << 20) == (2, 3)


def test_placement_counts_ranks_holding_memory_on_a_gpu_not_their_own():
    ranks = [(100, 0), (101, 1), (102, 2), (103, 0)]  # rank 3 shares GPU 0 by the device map
    holders = {0: {100, 101, 102, 103, 999}, 1: {101}, 2: {102}}
    assert placement_summary(ranks, holders) == {
        "nvml_pids_matched": True,
        "foreign_ranks_on_gpu0": 2,
        "gpu0_foreign_ranks": "1,2",
        "ranks_on_foreign_device": 2,
        "foreign_device_ranks": "1,2",
    }
    healthy = placement_summary(ranks, {0: {100, 103}, 1: {101}, 2: {102}})
    assert healthy["foreign_ranks_on_gpu0"] == 0 and healthy["ranks_on_foreign_device"] == 0


def test_placement_in_a_pid_namespace_says_it_could_not_match():
    assert placement_summary([(5, 0), (6, 1)], {0: {4242}, 1: {4243}}) == {"nvml_pids_matched": False}
