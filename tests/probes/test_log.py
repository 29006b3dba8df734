"""probes.log: signatures, ranks and retention on real logs (tests/fixtures/logs/)."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probes import log as logmod
from probes.facts import Log
from probes.log import SIGNATURES, LogError, log_from_text, read_log

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"

# One real-looking line per signature: every published id must have one, and the line must
# survive the cheap block prefilter, or the reader would never look at it.
SAMPLES = {
    "nccl_error": "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:784, unhandled system error, NCCL version 2.7.8",
    "nccl_unhandled_system_error": "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.",
    "nccl_unhandled_cuda_error": "RuntimeError: NCCL Error 1: unhandled cuda error",
    "nccl_invalid_usage": "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
    "nccl_internal_error": "RuntimeError: NCCL error in: ../torch/lib/c10d/ProcessGroupNCCL.cpp:825, internal error, NCCL version 2.7.8",
    "nccl_remote_error": "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
    "nccl_warn": "node1:1234:1290 [0] transport/net_ib.cc:123 NCCL WARN NET/IB : Got completion with error 12",
    "nccl_cuda_failure": "4d1a2ae696c8:50555:50555 [0] NCCL WARN Cuda failure 'named symbol not found'",
    "nccl_shm_error": "Error while creating shared memory segment /dev/shm/nccl-1YsMbG (size 7340384)",
    "nccl_socket_error": "include/socket.h:344 WARN Socket creation failed : Address family not supported by protocol",
    "nccl_ib_error": "node1:1234:1290 [0] transport/net_ib.cc:123 NCCL WARN NET/IB : Got completion with error 12",
    "nccl_ibverbs_missing": "host:15833:15833 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]",
    "nccl_transport": "104-171-200-210:62236:62931 [1] NCCL INFO Ring 00 : 1[1] -> 0[0] via P2P/IPC",
    "nccl_env": "4d1a2ae696c8:50555:50719 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to LOC",
    "nccl_version": "NCCL version 2.14.3+cuda11.8",
    "nccl_async_teardown": "[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels",
    "nccl_watchdog_timeout": "[E ProcessGroupNCCL.cpp:587] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(OpType=BROADCAST, Timeout(ms)=1800000) ran for 1802157 milliseconds before timing out.",
    "nccl_heartbeat_timeout": "[rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 0] Heartbeat monitor timed out! Process will be terminated after dumping debug info.",
    "nccl_not_built": "RuntimeError: Distributed package doesn't have NCCL built in",
    "nccl_comm_init_failed": "ncclCommInitRank failed: invalid usage",
    "gloo_timeout": "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete",
    "collective_mismatch": "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running inconsistent collective: CollectiveFingerPrint(OpType=ALLGATHER, TensorShape=[41, 256])",
    "address_in_use": "RuntimeError: Address already in use",
    "rendezvous_timeout": "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
    "connection_refused": "RuntimeError: Connection refused",
    "child_failed": "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "sigkill_exit": "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 3 (pid: 812917) of binary: /usr/bin/python",
    "lightning_ddp_init": "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2",
    "lightning_all_registered": "All distributed processes registered. Starting with 2 processes",
    "lightning_cuda_visible": "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0,1,2,3]",
    "interactive_incompatible": "MisconfigurationException: `Trainer(strategy='ddp')` is not compatible with an interactive environment.",
    "pickle_error": "_pickle.PicklingError: Can't pickle <function <lambda> at 0x7f>: attribute lookup <lambda> on __main__ failed",
    "torch_extensions_root": "Using /root/.cache/torch_extensions/py310_cu118 as PyTorch extensions root...",
    "duplicate_gpu": "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 10",
    "duplicate_global_rank": None,  # emitted from two lightning_ddp_init lines, tested below
    "device_mismatch": "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cuda:0!",
    "ddp_multi_device_module": "ValueError: DistributedDataParallel device_ids and output_device arguments only work with single-device/multiple-device GPU modules or CPU modules",
    "quantized_wrong_device": "ValueError: You can't train a model that has been loaded in 8-bit precision on a different device than the one you're training on.",
    "cuda_oom": "RuntimeError: CUDA out of memory. Tried to allocate 2.87 GiB (GPU 0; 14.76 GiB total capacity; 8.77 GiB already allocated)",
    "cuda_fork_reinit": "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method",
    "cuda_invalid_device_ordinal": "RuntimeError: CUDA error: invalid device ordinal",
    "cuda_no_kernel_image": "RuntimeError: CUDA error: no kernel image is available for execution on the device",
    "cuda_arch_incompatible": "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch installation.",
    "cuda_driver_too_old": "AssertionError: The NVIDIA driver on your system is too old (found version 10010).",
    "torch_not_compiled_with_cuda": 'AssertionError: Torch not compiled with CUDA enabled',
    "no_cuda_gpus": " But your machine only has: []",
    "cuda_error": "RuntimeError: CUDA error: an illegal memory access was encountered",
    "ddp_unused_parameters": "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one.",
    "ddp_param_shape_mismatch": "RuntimeError: DDP expects same model across all ranks, but Rank 0 has 2 params, while rank 1 has inconsistent 1 params.",
    "ddp_verify_params": "    _verify_param_shape_across_processes(self.process_group, parameters)",
    "shm_bus_error": 'RuntimeError: DataLoader worker (pid 13) is killed by signal: Bus error.',
    "shm_no_space": "RuntimeError: unable to write to file </torch_18692_1954506624>: No space left on device (28)",
    "dataloader_worker_died": "RuntimeError: DataLoader worker (pid(s) 1234) exited unexpectedly",
    "lightning_mixed_packages": "TypeError: `model` must be a `LightningModule` or `torch._dynamo.OptimizedModule`, got `MyModel`",
    "python_exception": "ValueError: bad value",
}


def fixture(name: str) -> Log:
    return read_log(FIXTURES / name, name)


def sigs(log: Log, sig_id: str):
    return [s for s in log.signatures if s.id == sig_id]


def test_every_signature_has_a_sample_and_the_docstring_lists_it():
    assert set(SAMPLES) == set(SIGNATURES)
    for sig_id in SIGNATURES:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", sig_id)
        assert re.search(rf"^\s+{sig_id}\s", logmod.__doc__, re.MULTILINE), f"{sig_id} undocumented"


def test_every_anchor_holds_a_prefilter_key():
    assert [a for a in logmod._ANCHORS if not any(k in a for k in logmod._KEYS)] == []


@pytest.mark.parametrize("sig_id", [k for k, v in SAMPLES.items() if v])
def test_sample_line_gives_its_signature(sig_id):
    line = SAMPLES[sig_id]
    assert any(a in line for a in SIGNATURES[sig_id].anchors), "no anchor: the reader would never try it"
    assert logmod._PREFILTER.search(line), "the prefilter would skip this line"
    assert sig_id in log_from_text(line).signature_ids


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
        (0, "96120", "25624887"), (0, "96117", "25625613"), (7, "64088", "25625251")]


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
        ["initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/8", "initializing ddp: GLOBAL_RANK: 0, MEMBER: 1/8",
         "initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/8"])
    log = log_from_text(text)
    (dup,) = sigs(log, "duplicate_global_rank")
    assert dup.rank == 1 and dup.line == 3
    assert [s.rank for s in sigs(log, "lightning_ddp_init")] == [1, 0, 1]


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
    lines[70_000:70_005] = ["Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
                            "    torch.load(path)", "ValueError: bad", "step after"]
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
    for source in (path, str(path), io.StringIO(text), io.BytesIO(text.encode()), text.splitlines(),
                   [b"a", b"RuntimeError: Address already in use"]):
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
    truncated = "RuntimeError: CUDA out of memory. Tried to allocate 2.87 GiB (GPU 0; 14.76".encode()
    assert read_log(io.BytesIO(truncated), "t").signature_ids == ["cuda_oom", "python_exception"]
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
@given(st.lists(st.one_of(st.sampled_from([v for v in SAMPLES.values() if v]), st.text(max_size=120)),
                max_size=60))
def test_fuzz_text_never_raises(lines):
    try:
        log = log_from_text("\n".join(lines))
    except LogError as exc:  # the documented outcome for text that is mostly control characters
        assert str(exc).startswith("log: not a text log")
        return
    Log.model_validate(log.model_dump())
    assert all(s.id in SIGNATURES for s in log.signatures)


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
