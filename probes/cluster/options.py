"""The run's options and its clock: every wait has a deadline."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

from probes.microtests.checks import SIZES

# Rank 0 stops gathering this long before the hard deadline, to diagnose and write in time.
WRITE_RESERVE_S = 3.0


@dataclass
class Options:
    timeout: float = 180.0  # the whole run, per rank; the watchdog's hard deadline
    join_timeout: float = 60.0  # for every rank to arrive
    op_timeout: float = 60.0  # for one collective
    backend: str | None = None  # nccl where CUDA is available, else gloo
    max_bytes: int = SIZES[-1]  # largest all_reduce in the sweep
    microtests: bool = True
    torch_timeout: float = 30.0  # for the node's torch probe (a child process)


@dataclass
class Clock:
    start: float
    options: Options

    def left(self) -> float:
        return self.start + self.options.timeout - time.monotonic()

    def join_left(self) -> float:
        return min(self.start + self.options.join_timeout - time.monotonic(), self.left() - WRITE_RESERVE_S)

    def op_timeout(self) -> timedelta:
        return timedelta(seconds=max(1.0, min(self.options.op_timeout, self.left() - 2 * WRITE_RESERVE_S)))
