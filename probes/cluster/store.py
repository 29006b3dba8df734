"""The control plane: the job's TCP store (torchrun's agent store, or one rank 0 hosts as
``env://`` would), not a collective, so rank 0 can always say who arrived where, even when a
collective hangs or a node never starts."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

from probes.cluster.identity import Identity
from probes.cluster.options import WRITE_RESERVE_S, Clock

PREFIX = "diagnose/"
_POLL_S = 0.05


class ControlPlane:
    """This rank's side of the protocol. Keys: ``arrived/R`` (who came, from where), ``roster``
    (rank 0: who came in time), ``step/R`` (where rank R is now), ``report/R`` (its results),
    ``exit`` (rank 0's verdict) and ``read`` (how many ranks took it)."""

    def __init__(self, me: Identity, clock: Clock) -> None:
        self.me, self.clock = me, clock
        self.store: Any = None
        self.roster: dict[int, dict] = {}  # rank -> its arrival (node, pid, ...)
        self.payloads: dict[int, dict] = {}  # rank 0: what has arrived so far

    def key(self, *parts: Any) -> str:
        return PREFIX + "/".join(str(p) for p in parts)

    def connect(self) -> None:
        import torch.distributed as dist

        host = self.me.rank == 0 and not self.me.agent_store
        self.store = dist.TCPStore(
            self.me.master_addr,
            self.me.master_port,
            None,
            host,
            timeout=timedelta(seconds=max(1.0, self.clock.join_left())),
            wait_for_workers=False,
            multi_tenant=host,
        )

    def announce(self) -> None:
        arrival = {"node": self.me.node, "hostname": self.me.hostname, "node_rank": self.me.node_rank,
                   "local_rank": self.me.local_rank, "pid": os.getpid()}  # fmt: skip
        self.store.set(self.key("arrived", self.me.rank), json.dumps(arrival))

    def join(self) -> None:
        """Rank 0 waits for every rank, then publishes who came; the others read that."""
        if self.me.rank == 0:
            waiting = set(range(self.me.world_size))
            while True:  # at least one look, however late this rank itself started
                waiting -= {r for r in waiting if self.store.check([self.key("arrived", r)])}
                if not waiting or self.clock.join_left() <= 0:
                    break
                time.sleep(_POLL_S)
            came = [r for r in range(self.me.world_size) if r not in waiting]
            self.store.set(
                self.key("roster"), json.dumps({r: json.loads(self.store.get(self.key("arrived", r))) for r in came})
            )
        else:
            self.store.wait(
                [self.key("roster")], timedelta(seconds=max(1.0, self.clock.join_left() + 2 * WRITE_RESERVE_S))
            )
        self.roster = {int(r): v for r, v in json.loads(self.store.get(self.key("roster"))).items()}

    def set_step(self, name: str) -> None:
        if self.store is not None:
            self.store.set(self.key("step", self.me.rank), name)

    def post(self, payload: dict) -> None:
        self.store.set(self.key("report", self.me.rank), json.dumps(payload))

    def gather(self) -> None:
        """Rank 0: read the ranks' results as they come, until all are in or time is up."""
        waiting = set(self.roster) - set(self.payloads)
        while waiting and self.clock.left() > WRITE_RESERVE_S:
            for rank in sorted(waiting):
                if self.store.check([self.key("report", rank)]):
                    self.payloads[rank] = json.loads(self.store.get(self.key("report", rank)))
            waiting = set(self.roster) - set(self.payloads)
            if waiting:
                time.sleep(_POLL_S)

    def share_verdict(self, code: int) -> None:
        """Rank 0: the exit code for all; wait (briefly) until every rank that came has read it."""
        self.store.set(self.key("exit"), str(code))
        others = len(self.roster) - 1
        until = time.monotonic() + min(WRITE_RESERVE_S, max(0.0, self.clock.left()))
        while self.store.add(self.key("read"), 0) < others and time.monotonic() < until:
            time.sleep(_POLL_S)

    def await_verdict(self) -> int:
        try:
            self.store.wait([self.key("exit")], timedelta(seconds=max(1.0, self.clock.left())))
            code = int(self.store.get(self.key("exit")))
            self.store.add(self.key("read"), 1)
        except Exception as exc:  # rank 0 gone: its report, if any, is all there is
            sys.stderr.write(
                f"diagnose cluster: rank {self.me.rank}: no word from rank 0 ({type(exc).__name__}); exiting\n"
            )
            return 1
        return code

    def steps_of_silent(self, store: Any) -> dict[int, str]:
        if store is None:
            return {}
        steps = {}
        for rank in self.roster:
            if rank not in self.payloads and store.check([self.key("step", rank)]):
                steps[rank] = store.get(self.key("step", rank)).decode(errors="replace")
        return steps

    def fresh_client(self) -> Any:
        """A second store connection, for the watchdog while the main thread may hold the first."""
        import torch.distributed as dist

        return dist.TCPStore(
            self.me.master_addr, self.me.master_port, None, False, timeout=timedelta(seconds=2), wait_for_workers=False
        )
