"""Check: the log reader of the working tree gives the same Log as the one of a git revision.

    python bench/log_equivalence.py [REV]   (default HEAD)

Both readers read, with the shipped rules' log literals as ``keep``, every case log and
environment report (../shared/cases, tests/cases), the fixture logs, long generated logs
(bench/log_reader.py's NCCL INFO log, a log where most lines are relevant), and each of
those variants: CRLF line ends, a UTF-8 and a UTF-16 byte-order mark, invalid bytes and
progress-bar carriage returns sprinkled in. Prints each input that differs and a count;
exits 1 on any difference.
"""

from __future__ import annotations

import codecs
import importlib.util
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def module_at(rev: str, file: str):
    """A module of the tree (``probes/log.py``) as it is at ``rev``, loaded beside the working
    tree's under another name."""
    source = subprocess.run(["git", "show", f"{rev}:{file}"], cwd=ROOT, capture_output=True, check=True).stdout
    name = Path(file).stem + "_at_rev"
    path = Path(tempfile.mkdtemp(prefix="at-rev-")) / f"{name}.py"
    path.write_bytes(source)
    return module(name, path)


def texts() -> list[tuple[str, bytes]]:
    found: list[tuple[str, bytes]] = []
    for folder in (ROOT.parent / "shared" / "cases", ROOT / "tests" / "cases"):
        for path in sorted(folder.glob("*.yaml")):
            case = yaml.safe_load(path.read_text()) or {}
            for key in ("env_report", "log"):
                if case.get(key):
                    found.append((f"{path.name}:{key}", f"{case.get('title', '')}\n{case[key]}".encode()))
    for path in sorted((ROOT / "tests" / "fixtures" / "logs").glob("*.log")):
        found.append((path.name, path.read_bytes()))
    return found


def long_logs(tmp: Path) -> list[tuple[str, bytes]]:
    log_reader = module("log_reader", ROOT / "bench" / "log_reader.py")
    path = tmp / "nccl.log"
    log_reader.write_log(path, 24)
    # most lines relevant, so that retention runs from the newest block back; tracebacks,
    # progress bars, wide characters between them
    shapes = (
        "[rank{r}]: warn {i} NCCL WARN Cuda failure 'out of memory'",
        "Epoch 1: {i}it [00:10, loss=0.{i}]\r",
        '[rank{r}]:Traceback (most recent call last):\n[rank{r}]:  File "t.py", line {i}\n'
        "[rank{r}]:RuntimeError: CUDA error: out of memory {i}",
        "step {i} nothing to see 卡住 █▌",
    )
    text = "\n".join(shapes[min(i % 11, 3) if i % 499 else 2].format(i=i, r=i % 4) for i in range(60_000))
    return [("generated NCCL INFO log", path.read_bytes()), ("mostly relevant", text.encode())]


def variants(name: str, data: bytes) -> list[tuple[str, bytes]]:
    rng = random.Random(len(data))
    noisy = bytearray(data)
    for _ in range(max(1, len(data) // 5000)):
        noisy[rng.randrange(len(noisy) + 1) : 0] = rng.choice(
            [b"\xff", b"\xc3", b"\xe2\x96", b"\x80\x80", b"\r", b"\xe5\x8d\xa1"]
        )
    text = data.decode("utf-8", errors="replace")
    return [
        (name, data),
        (f"{name} [CRLF]", data.replace(b"\n", b"\r\n")),
        (f"{name} [UTF-8 BOM]", codecs.BOM_UTF8 + data),
        (f"{name} [UTF-16]", text.encode("utf-16")),
        (f"{name} [invalid bytes]", bytes(noisy)),
    ]


def main(argv: list[str]) -> int:
    import io

    from diagnose.kb import load_kb
    from probes import log as new

    old = module_at(argv[0] if argv else "HEAD", "probes/log.py")
    keep = sorted(load_kb().log_literals)
    with tempfile.TemporaryDirectory() as tmp:
        inputs = texts() + long_logs(Path(tmp))
    checked = differ = 0
    for name, data in inputs:
        for label, raw in variants(name, data):
            results = []
            for reader in (old, new):
                try:
                    results.append(reader.read_log(io.BytesIO(raw), "log", keep))
                except reader.LogError as exc:
                    results.append(f"LogError: {exc}")
            checked += 1
            if results[0] != results[1]:
                differ += 1
                print(f"differs: {label}")
    print(f"{checked} inputs, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
