"""mp.spawn on a fixed MASTER_PORT that another program (here: a leftover server started by
the same script) already listens on (launch.port-in-use)."""

import os
import socket
import sys

import torch.distributed as dist
import torch.multiprocessing as mp


def work(rank: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)


if __name__ == "__main__":
    port = sys.argv[1]
    leftover = socket.socket()
    leftover.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    leftover.bind(("127.0.0.1", int(port)))
    leftover.listen()  # a previous run's server still holding the port
    mp.spawn(work, args=(port,), nprocs=2)
