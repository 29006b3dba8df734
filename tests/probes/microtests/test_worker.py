import pytest

from probes.microtests.errors import classify
from probes.microtests.worker import planted_fault, query


def test_a_monitored_barrier_timeout_names_the_missing_ranks():
    text = "RuntimeError: [Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 2039 ms"
    assert classify(text) == (True, [1, 3])
    assert classify("RuntimeError: [Rank 0]: Rank 2 failed to pass monitoredBarrier in 9 ms") == (
        True,
        [2],
    )


def test_other_errors_are_neither_timeouts_nor_name_ranks():
    assert classify("RuntimeError: Connection closed by peer [127.0.0.1]:29500") == (False, [])
    assert classify("DistStoreError: Timed out after 5 seconds waiting for clients")[0]


def test_faults_are_honoured_only_in_test_mode(monkeypatch):
    monkeypatch.setenv("DIAGNOSE_MICROTEST_FAULT", "barrier:1:skip_barrier")
    monkeypatch.delenv("DIAGNOSE_MICROTEST_TESTING", raising=False)
    assert planted_fault("barrier", 1) is None
    monkeypatch.setenv("DIAGNOSE_MICROTEST_TESTING", "1")
    assert planted_fault("barrier", 1) == "skip_barrier"
    assert planted_fault("barrier", 0) is None
    assert planted_fault("all_reduce", 1) is None


def test_query_reports_torch_backends_and_lightning():
    pytest.importorskip("torch")
    info = query()
    assert info["torch"].startswith("2.")
    assert info["distributed"] and info["gloo"]
    assert isinstance(info["cuda"], bool)
    assert info["device_count"] >= 1 if info["cuda"] else info["device_count"] == 0
    assert info["lightning"] is True
