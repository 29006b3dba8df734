"""The one redactor: every planted credential shape is removed, ordinary text is kept."""

from __future__ import annotations

import pytest

from probes.redact import REDACTED, Redactor, redact, redact_lines, redact_value, scrub, strip_controls
from tests.adversarial.secrets import ENV_VALUES, PLANTED, PRIVATE_KEY_LINES, PRIVATE_KEY_SECRETS


def test_the_corpus_has_fifty_shapes() -> None:
    assert len(PLANTED) + len(ENV_VALUES) + 1 >= 50


@pytest.mark.parametrize(("line", "secret"), PLANTED, ids=[line[:40] for line, _ in PLANTED])
def test_planted_secret_is_redacted(line: str, secret: str) -> None:
    out = redact(line)
    assert secret not in out
    assert REDACTED in out


@pytest.mark.parametrize(("name", "value", "secret"), ENV_VALUES, ids=[n for n, _, _ in ENV_VALUES])
def test_allow_listed_values_are_checked_too(name: str, value: str, secret: str) -> None:
    assert redact_value(name, value) == REDACTED


def test_private_key_block_is_redacted_whole_across_separate_lines() -> None:
    out = redact_lines(["[rank0]: loading key", *PRIVATE_KEY_LINES, "Traceback (most recent call last):"])
    joined = "\n".join(out)
    for secret in PRIVATE_KEY_SECRETS:
        assert secret not in joined
    assert out[0] == "[rank0]: loading key" and out[-1] == "Traceback (most recent call last):"
    assert redact("\n".join(PRIVATE_KEY_LINES)).split("\n") == [
        PRIVATE_KEY_LINES[0],
        REDACTED,
        REDACTED,
        REDACTED,
        PRIVATE_KEY_LINES[-1],
    ]
    # a second pass over already redacted lines still hides the short last line
    once = [redact(line) for line in PRIVATE_KEY_LINES]
    assert "kTail9Q==" in once and "kTail9Q==" not in redact_lines(once)


def test_a_key_block_cut_short_does_not_swallow_the_rest() -> None:
    out = redact_lines([PRIVATE_KEY_LINES[0], PRIVATE_KEY_LINES[1], "RuntimeError: CUDA out of memory."])
    assert out[-1] == "RuntimeError: CUDA out of memory."


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB",
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275",
        '  File "/home/Alice/envs/Llama2/lib/python3.10/site-packages/torch/nn/parallel/distributed.py", line 798',
        "Token indices sequence length is longer than the specified maximum",
        "hparams: {'pad_token': '<pad>', 'max_tokens': 2048, 'eos_token': '</s>'}",
        "torch 2.3.0+cu121 git_version 6f2c8e1d4f7a0b5c9e2d6a8f1c3b7e4d0a92b1c3",
        "Basic usage: diagnose --help",
        "MASTER_ADDR=node01 MASTER_PORT=29500 RANK=0",
        "TORCHELASTIC_RUN_ID=8b1a9953c4611296a827abf8c47804d7",
        # the H200 the suite ran on, as nvidia-smi -L names it: its uuid was redacted, so the
        # machine's snapshot no longer read back as the facts it was written from
        "GPU 0: NVIDIA H200 (UUID: GPU-26ff2e4e-a51e-7fd8-10c1-154a6fcca3a2)",
        "MIG-7f2b9c1e-4a3d-5e6f-8b0a-1c2d3e4f5a6b",
    ],
)
def test_ordinary_text_is_kept(line: str) -> None:
    assert redact(line) == line


def test_scrub_walks_data_in_order_and_knows_env_names() -> None:
    data = {"env": {"NCCL_IB_PKEY": "0x1", "NCCL_DEBUG": "INFO"}, "lines": PRIVATE_KEY_LINES, "n": 3}
    out = scrub(data)
    assert out["env"] == {"NCCL_IB_PKEY": REDACTED, "NCCL_DEBUG": "INFO"}
    assert all(line == REDACTED for line in out["lines"][1:-1]) and out["n"] == 3


def test_controls_are_stripped_only_when_asked() -> None:
    hostile = "loss\x1b]0;pwned\x07 nan\x1b]52;c;ZXZpbA==\x07\x1b[2J\r\x9b end\u202e"
    assert strip_controls(hostile) == "loss nan end"
    assert scrub([hostile]) == [hostile] and scrub([hostile], controls=True) == ["loss nan end"]
    assert strip_controls("tab\tand\nnewline") == "tab\tand\nnewline"


def test_redactor_state_is_per_stream() -> None:
    first = Redactor()
    first.text(PRIVATE_KEY_LINES[0])
    assert Redactor().text("QUFBQQ==") == "QUFBQQ=="
    assert first.text("QUFBQQ==") == REDACTED


def test_a_key_block_split_over_log_line_records_is_followed_per_field() -> None:
    records = [{"no": i, "text": text, "source": "/logs/train.log"} for i, text in enumerate(PRIVATE_KEY_LINES)]
    out = scrub({"lines": records})["lines"]
    assert [r["text"] for r in out][1:-1] == [REDACTED] * (len(PRIVATE_KEY_LINES) - 2)
    assert all(r["source"] == "/logs/train.log" for r in out)
