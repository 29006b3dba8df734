"""probes.log: signatures, ranks and retention on real logs (tests/fixtures/logs/)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.kbtest import run_signature_example, signature_examples
from probes import log as logmod
from probes.facts import Log
from probes.log import LogError, known_signatures, log_from_text, read_log
from probes.signatures import shipped

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"


def fixture(name: str) -> Log:
    return read_log(FIXTURES / name, name)


def sigs(log: Log, sig_id: str):
    return [s for s in log.signatures if s.id == sig_id]


CATALOG = shipped()
EXAMPLES = signature_examples()


@pytest.mark.parametrize("sig_id,kind,i,line", EXAMPLES, ids=[f"{e[0]}::{e[1]}{e[2]}" for e in EXAMPLES])
def test_signature_examples(sig_id, kind, i, line):
    """Every catalogued example line is recognised (or not) by the reader, as its data says,
    alone and inside a long log: the check `diagnose kb test` runs."""
    result = run_signature_example(sig_id, kind, i, line)
    assert result.ok, result.message


@pytest.mark.parametrize("sig_id", sorted(CATALOG.signatures))
def test_signature_found_on_a_long_log(sig_id):
    """A signature's line in the middle of a log far past the short-log size is still found."""
    line = CATALOG.signatures[sig_id].examples.match[0]
    noise = ["Epoch 1: 40%|####      | 400/1000 [00:10<00:15, loss=0.5]"] * (logmod.SHORT_LOG_LINES + 500)
    log = read_log(iter([*noise, line, *noise]))
    assert sig_id in log.signature_ids
    assert any(line.strip()[:80] in kept.text for kept in log.lines), "the line itself is retained"


def test_unrelated_lines_give_no_signature():
    text = "Epoch 3: 100%|##########| 50/50 [00:10<00:00, loss=0.1]\nsaving checkpoint to ckpt/last.pt\n"
    assert log_from_text(text).signatures == []


def test_watchdog_with_rank_prefixes():
    log = fixture("watchdog_rank_prefix.log")
    found = sigs(log, "nccl_watchdog_timeout")
    assert [s.rank for s in found] == [1, 0, 2]
    assert found[0].data == {"collective": "ALLREDUCE", "seq": "808", "timeout_ms": "600000", "ran_ms": "600020"}
    assert log.failing_ranks == [0, 1, 2]
    assert [line.rank for line in log.lines] == [1, 1, 0, 0, 2, 2]
    assert log.source == "log" and log.sources == ["watchdog_rank_prefix.log"] and log.lines_read == 6


def test_watchdog_behind_paste_line_numbers():
    found = sigs(fixture("watchdog_line_numbered.log"), "nccl_watchdog_timeout")
    assert [(s.rank, s.data["seq"]) for s in found] == [(0, "1580"), (4, "1580")]


def test_watchdog_torch1_after_a_progress_bar():
    found = sigs(fixture("watchdog_torch1.log"), "nccl_watchdog_timeout")
    assert [(s.rank, s.data["seq"], s.data["ran_ms"]) for s in found] == [
        (0, "96120", "25624887"),
        (0, "96117", "25625613"),
        (7, "64088", "25625251"),
    ]


def test_torchrun_summary_names_the_first_failing_rank():
    log = fixture("torchrun_sigkill.log")
    (child,) = [s for s in sigs(log, "child_failed") if "first_failing_rank" in s.data]
    assert child.rank == 0 and child.data["first_failing_rank"] == "0" and child.line == 21
    kills = sigs(log, "sigkill_exit")
    assert {s.rank for s in kills} == {0}
    assert any(s.data.get("exitcode") == "-9" for s in kills)


def test_torchrun_agent_line_gives_local_rank_not_rank():
    (kill,) = sigs(fixture("torchrun_agent_failed.log"), "sigkill_exit")
    assert kill.rank is None and kill.data == {"exitcode": "-9", "local_rank": "3"}


def test_mpi_tagged_output_and_duplicate_gpu():
    log = fixture("duplicate_gpu_mpi_tagged.log")
    dup = sigs(log, "duplicate_gpu")
    assert [(s.rank, s.data) for s in dup] == [
        (2, {"rank_a": "2", "rank_b": "0", "device": "1000"}),
        (4, {"rank_a": "4", "rank_b": "0", "device": "1000"}),
    ]


def test_duplicate_gpu_inside_ddp_verify():
    log = fixture("duplicate_gpu_verify_params.log")
    assert {"duplicate_gpu", "nccl_invalid_usage", "nccl_error", "ddp_verify_params"} <= set(log.signature_ids)
    (err,) = sigs(log, "nccl_error")
    assert err.data == {"error": "invalid usage", "nccl_version": "2.18.6"}


def test_cuda_oom_across_torch_versions():
    found = sigs(fixture("cuda_oom_formats.log"), "cuda_oom")
    assert [s.data for s in found] == [
        {"requested": "2.87 GiB", "device": "0", "total": "14.76 GiB"},
        {"requested": "1.70 GiB", "device": "0", "total": "6.00 GiB"},
        {"requested": "22.00 MiB", "device": "0", "total": "23.65 GiB"},
    ]


def test_duplicate_global_rank_from_lightning_banners():
    text = "\n".join(
        [
            "initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/8",
            "initializing ddp: GLOBAL_RANK: 0, MEMBER: 1/8",
            "initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/8",
        ]
    )
    log = log_from_text(text)
    (dup,) = sigs(log, "duplicate_global_rank")
    assert dup.rank == 1 and dup.line == 3
    assert [s.rank for s in sigs(log, "lightning_ddp_init")] == [1, 0, 1]


def test_a_banner_the_reader_quotes_is_no_second_process():
    text = "\n".join(
        [
            'It stops at **`"initializing ddp: GLOBAL_RANK: 0, MEMBER: 1/2"`**',
            "initializing ddp: GLOBAL_RANK: 0, MEMBER: 1/2",
        ]
    )
    assert sigs(log_from_text(text), "duplicate_global_rank") == []


def test_banners_of_worlds_of_one_are_no_claim_on_a_shared_rank():
    # each process formed a group of its own (or the reader pasted the banner twice)
    text = "\n".join(["Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/1"] * 2)
    assert sigs(log_from_text(text), "duplicate_global_rank") == []


def test_sagemaker_mpi_tag():
    log = log_from_text("[1,mpirank:3,algo-1]<stderr>:RuntimeError: CUDA error: out of memory")
    assert [s.rank for s in sigs(log, "cuda_oom")] == [3]


def test_slurm_label_prefix_and_lightning_rank_tag():
    log = log_from_text("0: starting\n1: RuntimeError: CUDA error: out of memory\n[rank: 1] Seed set to 42\n")
    assert [line.rank for line in log.lines] == [0, 1, 1]
    assert [s.rank for s in sigs(log, "cuda_oom")] == [1]


def test_local_rank_prefix_of_torchrun_tee():
    (s,) = sigs(log_from_text("[default3]:RuntimeError: CUDA error: out of memory"), "cuda_oom")
    assert s.rank is None and s.data["local_rank"] == "3"


def test_short_log_keeps_every_line():
    text = "\n".join(f"line {i}" for i in range(logmod.SHORT_LOG_LINES))
    log = log_from_text(text)
    assert log.lines_read == logmod.SHORT_LOG_LINES == len(log.lines)
    assert [line.no for line in log.lines[:2]] == [1, 2]


def test_long_log_keeps_head_tail_errors_and_tracebacks():
    lines = [f"step {i} loss 0.1" for i in range(100_000)]
    lines[50_000] = "RuntimeError: CUDA error: an illegal memory access was encountered"
    lines[70_000:70_005] = [
        "Traceback (most recent call last):",
        '  File "train.py", line 9, in <module>',
        "    torch.load(path)",
        "ValueError: bad",
        "step after",
    ]
    log = read_log(iter(lines), "big")
    kept = {line.no: line.text for line in log.lines}
    assert log.lines_read == 100_000
    assert len(kept) < 1000
    assert all(n in kept for n in (1, logmod.HEAD_LINES, 100_000, 100_000 - logmod.TAIL_LINES + 1))
    assert all(n in kept for n in range(50_001 - logmod.CONTEXT, 50_002 + logmod.CONTEXT))
    assert [kept[n] for n in range(70_001, 70_005)] == lines[70_000:70_004]
    assert 30_000 not in kept
    assert sigs(log, "cuda_error")[0].line == 50_001


def test_retention_and_signatures_are_bounded():
    lines = [f"[rank{i % 4}]:RuntimeError: CUDA error: out of memory {i}" for i in range(40_000)]
    log = read_log(iter(lines), "noisy")
    assert len(log.lines) <= logmod.MAX_RETAINED + logmod.HEAD_LINES + logmod.TAIL_LINES
    assert len(sigs(log, "cuda_oom")) == 4 * logmod.MAX_PER_SIGNATURE
    assert len(log.signatures) <= logmod.MAX_SIGNATURES
    assert log.lines[-1].no == 40_000


def test_sources(tmp_path, monkeypatch):
    text = "a\r\nRuntimeError: Address already in use\r\n"
    path = tmp_path / "train.log"
    path.write_bytes(text.encode())
    expected = ["a", "RuntimeError: Address already in use"]
    for source in (
        path,
        str(path),
        io.StringIO(text),
        io.BytesIO(text.encode()),
        text.splitlines(),
        [b"a", b"RuntimeError: Address already in use"],
    ):
        log = read_log(source, "x")
        assert [line.text for line in log.lines] == expected, source
        assert log.signature_ids == ["address_in_use", "python_exception"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert [line.text for line in read_log("-", "stdin").lines] == expected


def test_missing_file_is_a_log_error(tmp_path):
    with pytest.raises(LogError, match=r"^nope\.log: cannot read"):
        read_log(tmp_path / "nope.log", "nope.log")


def test_binary_file_is_a_log_error_naming_it(tmp_path):
    path = tmp_path / "core"
    path.write_bytes(bytes(range(256)) * 400)
    with pytest.raises(LogError, match=r"^core: not a text log"):
        read_log(path, "core")


def test_text_in_another_encoding_is_not_binary():
    gbk = ("训练时报错，多卡通信失败\n" * 400 + "RuntimeError: Address already in use\n").encode("gbk")
    log = read_log(io.BytesIO(gbk), "gbk.log")
    assert log.lines_read == 401 and "address_in_use" in log.signature_ids


def test_binary_tail_after_text_is_tolerated():
    data = ("RuntimeError: Address already in use\n" * 3000).encode() + bytes(range(256)) * 100
    log = read_log(io.BytesIO(data), "x")
    assert log.lines_read > 3000 and "address_in_use" in log.signature_ids


def test_empty_truncated_and_mixed_encodings():
    assert read_log(io.BytesIO(b""), "e").lines == [] and read_log(io.BytesIO(b""), "e").lines_read == 0
    truncated = b"RuntimeError: CUDA out of memory. Tried to allocate 2.87 GiB (GPU 0; 14.76"
    assert {"cuda_oom", "python_exception"} <= set(read_log(io.BytesIO(truncated), "t").signature_ids)
    mixed = "caf\u00e9 ok\n".encode() + "caf\u00e9 latin-1\n".encode("latin-1") + "\u00e9\u4e2d\n".encode("utf-8")[:-2]
    log = read_log(io.BytesIO(mixed), "m")
    assert log.lines_read == 3 and "\ufffd" in log.lines[1].text
    split = "caf\u00e9".encode()
    assert read_log([split[:4], split[4:]], "s").lines_read == 2  # items are lines, even split ones


def test_utf16_with_bom_and_carriage_returns():
    data = "Epoch 1:  10%\rEpoch 1:  20%\rRuntimeError: Address already in use\n".encode("utf-16")
    log = read_log(io.BytesIO(data), "win")
    assert [line.text for line in log.lines] == ["RuntimeError: Address already in use"]


def test_a_huge_line_without_newlines_is_cut():
    log = read_log(io.StringIO("x" * (3 * logmod.MAX_LINE_CHARS + 5)), "one")
    assert log.lines_read == 4 and max(len(line.text) for line in log.lines) <= logmod.KEPT_LINE_CHARS


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from([e[3] for e in EXAMPLES if e[1] == "match"]), st.text(max_size=120)), max_size=60
    )
)
def test_fuzz_text_never_raises(lines):
    try:
        log = log_from_text("\n".join(lines))
    except LogError as exc:  # the documented outcome for text that is mostly control characters
        assert str(exc).startswith("log: not a text log")
        return
    Log.model_validate(log.model_dump())
    assert all(s.id in known_signatures() for s in log.signatures)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4000))
def test_fuzz_bytes_raise_only_log_error(data):
    try:
        log = read_log(io.BytesIO(data), "fuzz")
    except LogError as exc:
        assert str(exc).startswith("fuzz: ")
    else:
        Log.model_validate(log.model_dump())
        assert log.lines_read <= data.count(b"\n") + data.count(b"\r") + 1


def test_credentials_never_reach_the_facts():
    token = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
    log = log_from_text(f"export HF_TOKEN={token}\nRuntimeError: 401 Unauthorized for {token}")
    dumped = log.model_dump_json()
    assert token not in dumped and "<redacted>" in dumped
    assert "python_exception" in log.signature_ids


def test_retention_does_not_depend_on_block_sizes(monkeypatch):
    """Kept lines are settled per block, newest block first once the first half is full: read
    in tiny blocks, a long log where most lines are relevant keeps exactly what one block does."""
    lines = []
    for i in range(40_000):
        if i % 997 == 0:
            lines += [
                f"[rank{i % 4}]:Traceback (most recent call last):",
                f'[rank{i % 4}]:  File "t.py", line {i}',
                f"[rank{i % 4}]:RuntimeError: CUDA error: out of memory {i}",
            ]
        elif i % 7 == 0:
            lines.append(f"Epoch 1: {i}it [00:10, loss=0.{i}]\r")
        elif i % 3 == 0:
            lines.append(f"step {i} nothing to see")
        else:
            lines.append(f"[rank{i % 4}]: warn {i}")
    text = "\n".join(lines)
    whole = log_from_text(text, keep=["loss="])
    monkeypatch.setattr(logmod, "BLOCK_BYTES", 5000)
    monkeypatch.setattr(logmod, "SUFFIX_BYTES", 1000)
    monkeypatch.setattr(logmod, "RING_BYTES", 40_000)
    small = log_from_text(text, keep=["loss="])
    assert small == whole
    assert len(whole.lines) >= logmod.MAX_RETAINED  # the selection is full: the ring was exercised


def test_a_signature_past_its_cap_still_keeps_its_lines():
    """After MAX_PER_SIGNATURE occurrences a signature is no longer recorded, but its lines are
    still relevant in a long log: kept with their context."""
    lines = [f"step {i} fine" for i in range(logmod.SHORT_LOG_LINES + 500)]
    for i in range(300, 300 + 40 * 10, 10):
        lines[i] = f"node1:{i}:{i} [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC"  # no error word
    log = log_from_text("\n".join(lines))
    kept = {line.no for line in log.lines}
    assert all(i + 1 in kept and i + 2 in kept for i in range(300, 700, 10))  # the line and its context
    assert sum(s.id == "nccl_transport" for s in log.signatures) == logmod.MAX_PER_SIGNATURE


def test_keep_words_match_ascii_lines_in_any_case_beside_wide_words():
    lines = [f"step {i}" for i in range(logmod.SHORT_LOG_LINES + 100)]
    lines[700], lines[900] = "Epoch 3 LOSS=nan", "训练卡住了"
    kept = {line.text for line in log_from_text("\n".join(lines), keep=["loss=", "卡住"]).lines}
    assert {"Epoch 3 LOSS=nan", "训练卡住了"} <= kept
    assert "step 500" not in kept


def test_the_block_finder_passes_over_nccl_collective_lines():
    """NCCL_DEBUG=INFO writes a line per collective, most of a long log: none of them can change
    a signature or the reader's state, so the block-wide finder flags none for a closer look
    (a host name such as node0, or "nranks", once flagged every one of them)."""
    line = (
        "node0:1006:2006 [6] NCCL INFO AllReduce: opCount 16c0 sendbuff 0x7ff4351ed4 recvbuff 0x7ff4351ed4 "
        "count 1048576 datatype 7 op 0 root 0 comm 0x55001002 [nranks=16] stream 0x56001002"
    )
    finder = logmod._Matcher(CATALOG, frozenset()).signature_finder
    assert logmod._Block("\n".join([line] * 500).encode(), finder).flagged == []
