"""The world size is read from torch.distributed before init_process_group has been called
(launch.process-group-not-initialized)."""

import torch.distributed as dist


def setup() -> int:
    world = dist.get_world_size()  # the process group does not exist yet
    dist.init_process_group("gloo")
    return world


print("world size", setup())
