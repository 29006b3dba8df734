"""The ``env`` section: the environment variables that shape a distributed job.

Only allow-listed names are kept, so an unrelated secret never enters a snapshot; and
among those, a name that sounds like a credential or a value that looks like one is
replaced by ``REDACTED``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from probes import redact as _redact
from probes.facts import Env
from probes.redact import REDACTED

__all__ = ["REDACTED", "allowed", "looks_secret", "parse_visible_devices", "probe", "redact_text", "redact_value"]

_ALLOWED_PREFIXES = (
    "NCCL_",
    "TORCH_",
    "TORCHELASTIC_",
    "CUDA_",
    "SLURM_",
    "OMPI_",
    "PMI_",
    "CUBLAS_",
    "GLOO_",  # GLOO_SOCKET_IFNAME picks gloo's interface as NCCL_SOCKET_IFNAME does NCCL's
    "PL_",  # Lightning's own switches: PL_TORCH_DISTRIBUTED_BACKEND, PL_RECONCILE_PROCESS
)
_ALLOWED_NAMES = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "OMP_NUM_THREADS",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_NVML_BASED_CUDA_CHECK",
        "NVIDIA_VISIBLE_DEVICES",  # what the container runtime exposed, before CUDA_VISIBLE_DEVICES
    }
)


def allowed(name: str) -> bool:
    return name in _ALLOWED_NAMES or name.startswith(_ALLOWED_PREFIXES)


def looks_secret(value: str) -> bool:
    return _redact.redact(value) != value


def redact_value(name: str, value: str) -> str:
    """A credential by its name, or anything credential-like in the value, blanks it whole."""
    return _redact.redact_value(name, value)


def redact_text(text: str) -> str:
    """Blank out credentials inside free text (a command line, a log line)."""
    return _redact.redact(text)


def parse_visible_devices(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as the list of entries written (indices, GPU-/MIG- UUIDs).

    Duplicates are kept: CUDA then exposes no device at all, which rules must see.
    """
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def probe(environ: Mapping[str, str] | None = None) -> Env:
    environ = os.environ if environ is None else environ
    values = {name: redact_value(name, value) for name, value in sorted(environ.items()) if allowed(name)}
    return Env(source="live", values=values, complete=True)
