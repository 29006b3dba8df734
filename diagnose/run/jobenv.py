"""The job's environment: the start-up hook, the Flight Recorder and the desync report turned on."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from probes.hang import HOOK_DIR, HOOK_SIGNAL

FR_BUFFER_ENTRIES = "2000"


def job_env(
    base: Mapping[str, str], out: Path, debug_env: bool, die_with_us: bool = True
) -> tuple[dict[str, str], Path | None]:
    """The job's environment and the Flight Recorder dump folder (None when it is off).

    Variables the user set are kept as they are: only unset ones get diagnose's values.
    ``die_with_us``: the job's Python processes ask to be killed with their parent (not for
    ``--keep``, whose job must outlive the supervisor).
    """
    env = dict(base)
    hook_dir = out / ".hook"
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR), *filter(None, [base.get("PYTHONPATH")])])
    env["DIAGNOSE_HOOK_DIR"] = str(hook_dir)
    env["DIAGNOSE_HOOK_SIGNAL"] = str(HOOK_SIGNAL)
    if die_with_us:
        env["DIAGNOSE_DIE_WITH"] = "leader"  # the hook's parent-death chain starts at the job's first process
    if not debug_env:
        return env, None
    fr_dir = out / "flight-recorder"
    size = env.get("TORCH_FR_BUFFER_SIZE") or env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or FR_BUFFER_ENTRIES
    env.setdefault("TORCH_FR_BUFFER_SIZE", size)
    env.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(fr_dir / "nccl_trace_rank_"))
    if _older_torch():  # newer torch warns about the old names
        env.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", size)
        env.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(fr_dir / "nccl_trace_rank_"))
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    env.setdefault("TORCH_NCCL_DESYNC_DEBUG", "1")
    if env["TORCH_FR_BUFFER_SIZE"].strip() in ("", "0"):
        return env, None
    env["DIAGNOSE_FR_DIR"] = str(fr_dir)
    return env, fr_dir


def _older_torch() -> bool:
    """Whether the job's torch may predate the TORCH_FR_* names (2.7); unknown counts as yes."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import InvalidVersion, Version

    try:
        return Version(version("torch")).release < (2, 7)
    except (PackageNotFoundError, InvalidVersion):
        return True
