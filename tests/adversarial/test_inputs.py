"""Untrusted input read in bounded time and memory, one line naming the place when refused."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from probes.snapshot import SnapshotError, load_snapshot
from probes.untrusted import MAX_JSON_DEPTH, InputError, decode_text, load_json, read_bytes


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"[" * 10_000 + b"]" * 10_000, f"x.json:1:{MAX_JSON_DEPTH + 1}: nested deeper than"),
        (b'{"schema_version": 1,\n "a": ' + b"9" * 5000 + b"}", "x.json:2:7: a number of 5000 digits"),
        (b'{"a": [1, 2,]}', "x.json:1:13: invalid JSON"),
    ],
)
def test_json_caps_name_the_place(raw: bytes, message: str) -> None:
    with pytest.raises(InputError) as caught:
        load_json(raw, "x.json")
    assert str(caught.value).startswith(message)


def test_brackets_and_digits_inside_strings_are_text() -> None:
    text = '{"a": "' + "[" * 500 + "1" * 100 + '", "b": "\\"]]"}'
    assert load_json(text.encode(), "x")["a"].startswith("[[[")


@pytest.mark.parametrize(
    "content",
    ["{" * 6000, "[" * 10_000 + "]" * 10_000, '{"schema_version": ' + "1" * 5000 + "}"],
    ids=["yaml-like-deep", "deep-array", "long-integer"],
)
def test_hostile_snapshot_is_one_line_with_its_place(tmp_path: Path, content: str) -> None:
    path = tmp_path / "facts.json"
    path.write_text(content)
    with pytest.raises(SnapshotError) as caught:
        load_snapshot(path)
    assert str(caught.value).startswith(f"{path}:1:") and "\n" not in str(caught.value)


def test_device_is_cut_at_the_size_cap() -> None:
    with pytest.raises(InputError, match="/dev/zero: more than 1 MiB"):
        read_bytes("/dev/zero", limit=1 << 20)


def test_big_regular_file_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    with path.open("wb") as f:
        f.truncate(3 << 20)  # sparse: no memory, no disk
    with pytest.raises(InputError, match=r"too large \(3 MiB; at most 1 MiB\)"):
        read_bytes(path, limit=1 << 20)


def test_fifo_with_no_writer_times_out(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="no data for 0.2 s"):
        read_bytes(fifo, idle=0.2)


def test_fifo_with_a_writer_is_read_whole(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(b"x" * 200_000)

    writer = threading.Thread(target=write)
    writer.start()
    assert read_bytes(fifo) == b"x" * 200_000
    writer.join()


def test_directory_and_missing_file() -> None:
    with pytest.raises(InputError, match="is a directory"):
        read_bytes("/")
    with pytest.raises(InputError, match="No such file"):
        read_bytes("/nonexistent/x")


def test_utf16_with_bom_and_binary() -> None:
    assert decode_text("PyTorch version: 2.1".encode("utf-16"), "r", "report") == "PyTorch version: 2.1"
    with pytest.raises(InputError, match="r: not a text report: binary data"):
        decode_text(b"\x7fELF\x00\x00", "r", "report")
