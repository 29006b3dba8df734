"""Reading someone else's input in bounded time and memory.

A report, snapshot or log may be a regular file, stdin, a pipe or process substitution
(``<(...)``), and by mistake a device or a FIFO nobody writes to. ``read_bytes`` reads any
of them with a size cap checked before and during the read and an idle deadline, so
``/dev/zero`` or a FIFO with no writer ends with a message instead of filling memory or
waiting forever. ``open_stream`` gives the same guarantees to the streaming log reader.
``load_json`` parses with depth and number-size caps, naming the line and column.
"""

from __future__ import annotations

import json
import os
import re
import select
import stat
import sys
from pathlib import Path
from typing import Any, BinaryIO

MAX_BYTES = 64 << 20
IDLE_SECONDS = 10.0
MAX_JSON_DEPTH = 64
MAX_NUMBER_CHARS = 40  # digits of a JSON number: 128-bit integers and any float fit
_BLOCK = 1 << 16
_STDIN_NAMES = ("-", "/dev/stdin")


class InputError(ValueError):
    """Input that cannot be read within the bounds: the message names it and why."""


def display_name(path: str) -> str:
    return "stdin" if path in _STDIN_NAMES else path


def _open_fd(path: str) -> tuple[int, bool]:
    """(fd, whether we opened it). Non-blocking, so a FIFO with no writer opens at once."""
    if path in _STDIN_NAMES:
        return sys.stdin.fileno(), False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        os.close(fd)
        raise InputError(f"{path}: cannot read: is a directory")
    return fd, True


class BoundedReader:
    """A binary stream over a file descriptor: at most ``limit`` bytes; the first data must
    come within ``idle`` seconds, later data within ``later_idle`` (a job's output piped in
    may pause; a FIFO nobody opened never starts)."""

    def __init__(
        self, path: str, *, limit: int = MAX_BYTES, idle: float = IDLE_SECONDS, later_idle: float | None = None
    ) -> None:
        self.name = display_name(path)
        self.fd, self._owned = _open_fd(path)
        self.limit, self.idle = limit, idle
        self.later_idle = idle if later_idle is None else later_idle
        self.count = 0
        mode = os.fstat(self.fd).st_mode
        self._regular = stat.S_ISREG(mode)
        if self._regular and os.fstat(self.fd).st_size > limit:
            size = os.fstat(self.fd).st_size
            self.close()
            raise InputError(f"{self.name}: too large ({size >> 20} MiB; at most {limit >> 20} MiB)")

    def read(self, size: int = _BLOCK) -> bytes:
        size = min(size if size and size > 0 else _BLOCK, _BLOCK)
        if not self._regular:
            wait = self.later_idle if self.count else self.idle
            ready, _, _ = select.select([self.fd], [], [], wait)
            if not ready:
                raise InputError(f"{self.name}: no data for {wait:g} s (a FIFO or device with no writer?)")
        try:
            chunk = os.read(self.fd, size)
        except BlockingIOError:
            chunk = b"" if self._regular else self.read(size)
        self.count += len(chunk)
        if self.count > self.limit:
            raise InputError(f"{self.name}: more than {self.limit >> 20} MiB")
        return chunk

    def close(self) -> None:
        if self._owned and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> BoundedReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_stream(
    path: str, *, limit: int = MAX_BYTES, idle: float = IDLE_SECONDS, later_idle: float | None = None
) -> BinaryIO:
    """``path`` (``-`` and ``/dev/stdin`` are stdin) as a bounded binary stream."""
    return BoundedReader(path, limit=limit, idle=idle, later_idle=later_idle)  # type: ignore[return-value]


def read_bytes(path: str | Path, *, limit: int = MAX_BYTES, idle: float = IDLE_SECONDS) -> bytes:
    parts: list[bytes] = []
    with BoundedReader(str(path), limit=limit, idle=idle) as reader:
        while chunk := reader.read(_BLOCK):
            parts.append(chunk)
    return b"".join(parts)


_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


def decode_text(data: bytes, name: str, what: str) -> str:
    """Text of a pasted file: UTF-8 or UTF-16 with its BOM; binary data is refused."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return data[len(bom) :].decode(encoding, errors="replace")
    if b"\x00" in data[:8192]:
        raise InputError(f"{name}: not a text {what}: binary data")
    return data.decode("utf-8", errors="replace")


# --- JSON ---------------------------------------------------------------------------------------

_STRINGS = re.compile(rb'"[^"\\\n]*(?:\\.[^"\\\n]*)*"')  # the unrolled loop: linear
_NUMBER = re.compile(rb"-?\d{%d,}" % (MAX_NUMBER_CHARS + 1))


def _place(raw: bytes, offset: int) -> str:
    line = raw.count(b"\n", 0, offset) + 1
    column = offset - raw.rfind(b"\n", 0, offset)
    return f"{line}:{column}"


def _too_deep(raw: bytes) -> int | None:
    """Offset where nesting first passes ``MAX_JSON_DEPTH``, strings skipped; None if never."""
    depth = 0
    skeleton = _STRINGS.sub(lambda m: b'""' + b" " * (len(m.group()) - 2), raw)
    for found in re.finditer(rb"[\[\]{}]", skeleton):
        depth += 1 if found.group() in (b"[", b"{") else -1
        if depth > MAX_JSON_DEPTH:
            return found.start()
    return None


def _number(text: str) -> Any:
    raise ValueError(f"number of {len(text)} digits")


def load_json(raw: bytes, name: str) -> Any:
    """JSON with its nesting and numbers capped; errors are ``InputError`` naming the place."""
    deep = _too_deep(raw)
    if deep is not None:
        raise InputError(f"{name}:{_place(raw, deep)}: nested deeper than {MAX_JSON_DEPTH} levels")
    number = _NUMBER.search(_STRINGS.sub(lambda m: b" " * len(m.group()), raw))
    if number is not None:
        raise InputError(
            f"{name}:{_place(raw, number.start())}: a number of {len(number.group())} digits (at most {MAX_NUMBER_CHARS})"
        )
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise InputError(f"{name}: not JSON: binary data") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{name}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:  # what the caps above should already stop
        raise InputError(f"{name}: invalid JSON: {exc}") from None
