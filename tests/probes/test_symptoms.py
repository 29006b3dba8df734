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
