"""The job's output, passed through unchanged and kept in the log."""

from __future__ import annotations

import os
import threading
import time
from typing import IO


class Tee:
    """Copies a child's stream to one of ours unchanged and into the shared log."""

    def __init__(self, log: IO[bytes]) -> None:
        self.log = log
        self.lock = threading.Lock()
        self.written = 0
        self.last_output = time.monotonic()
        self.threads: list[threading.Thread] = []
        self.muted = False  # once the supervisor ends the job: its reaction goes to the log only

    def start(self, stream: IO[bytes], sink: IO[bytes]) -> None:
        thread = threading.Thread(target=self._pump, args=(stream, sink), daemon=True)
        thread.start()
        self.threads.append(thread)

    def _pump(self, stream: IO[bytes], sink: IO[bytes]) -> None:
        fd = stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            self.last_output = time.monotonic()
            with self.lock:
                self.log.write(chunk)
                self.log.flush()
                self.written += len(chunk)
            if self.muted:
                continue
            try:
                sink.write(chunk)
                sink.flush()
            except (OSError, ValueError):
                pass  # our own output went away; keep the copy anyway
        stream.close()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
