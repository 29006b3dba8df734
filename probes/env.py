"""The ``env`` section: the environment variables that shape a distributed job.

Only allow-listed names are kept, so an unrelated secret never enters a snapshot; and
among those, a name that sounds like a credential or a value that looks like one is
replaced by ``REDACTED``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from probes.facts import Env

REDACTED = "<redacted>"

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

_SECRET_NAME = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD|AUTH|CREDENTIAL", re.IGNORECASE)

# Credential formats with a recognisable shape; a value containing one is redacted whole.
_SECRET_VALUE = re.compile(
    r"""
      \bhf_[A-Za-z0-9]{20,}                      # Hugging Face
    | \b(?:AKIA|ASIA)[0-9A-Z]{16}\b              # AWS access key id
    | \bgh[pousr]_[A-Za-z0-9]{30,}               # GitHub
    | \bsk-[A-Za-z0-9_-]{20,}                    # OpenAI-style API keys
    | \bxox[abpr]-[A-Za-z0-9-]{10,}              # Slack
    | \beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}  # JWT
    | ://[^/\s:@]+:[^/\s@]+@                     # user:password@ in a URL
    """,
    re.VERBOSE,
)
# A long unbroken run of key-like characters: how random secrets look when nothing else
# gives them away. Paths, hostnames and version strings have separators or are short.
_OPAQUE = re.compile(r"(?<![\w/.-])[A-Za-z0-9+/=_-]{32,}(?![\w/.-])")


def allowed(name: str) -> bool:
    return name in _ALLOWED_NAMES or name.startswith(_ALLOWED_PREFIXES)


def looks_secret(value: str) -> bool:
    if _SECRET_VALUE.search(value):
        return True
    return any(_mixed(m.group()) for m in _OPAQUE.finditer(value))


def _mixed(token: str) -> bool:
    # 32 hex digits or a long all-lowercase word are ids and names, not keys; a key mixes
    # letters of both cases with digits. An absolute path mixes them too, and is no key.
    return (
        not token.startswith("/")
        and any(c.isdigit() for c in token)
        and any(c.islower() for c in token)
        and any(c.isupper() for c in token)
    )


def redact_value(name: str, value: str) -> str:
    if _SECRET_NAME.search(name) or looks_secret(value):
        return REDACTED
    return value


def redact_text(text: str) -> str:
    """Blank out credentials inside free text (a command line): ``--token X``, ``KEY=X``."""
    words = text.split(" ")
    out: list[str] = []
    hide_next = False
    for word in words:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, sep, value = word.partition("=")
        if sep and _SECRET_NAME.search(name):
            out.append(f"{name}={REDACTED}")
        elif word.startswith("-") and _SECRET_NAME.search(word):
            out.append(word)
            hide_next = True
        elif looks_secret(word):
            out.append(REDACTED)
        else:
            out.append(word)
    return " ".join(out)


def parse_visible_devices(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as the list of entries written (indices, GPU-/MIG- UUIDs).

    Duplicates are kept: CUDA then exposes no device at all, which rules must see.
    """
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def probe(environ: Mapping[str, str] | None = None) -> Env:
    environ = os.environ if environ is None else environ
    values = {
        name: redact_value(name, value)
        for name, value in sorted(environ.items())
        if allowed(name)
    }
    return Env(source="live", values=values, complete=True)
