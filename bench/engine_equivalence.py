"""Check: the engine of the working tree gives the same reports as the one of a git revision.

    python bench/engine_equivalence.py [REV]   (default HEAD)

Both evaluate, against the shipped KB, the fixture snapshots, 400 random snapshots of
bench/engine.py's kind (another seed) and the offline facts of every case (../shared/cases,
tests/cases: its environment report and its title and log, as ``diagnose --offline`` reads
them). Prints each input whose JSON report differs and a count; exits 1 on any difference.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    import diagnose
    from diagnose import engine as new

    here = ROOT / "bench"
    loader = _load("log_equivalence", here / "log_equivalence.py")  # loads a file, or one at a revision
    bench = loader.module("engine_bench", here / "engine.py")
    old = loader.module_at(argv[0] if argv else "HEAD", "diagnose/engine.py")
    kb = diagnose.load_kb()
    inputs = [
        (path.name, diagnose.load_snapshot(path))
        for path in sorted((ROOT / "tests" / "fixtures" / "snapshots").glob("*.json"))
    ]
    rng = random.Random(4321)
    inputs += [(f"random snapshot {i}", bench.random_facts(rng)) for i in range(400)]
    for folder in (ROOT.parent / "shared" / "cases", ROOT / "tests" / "cases"):
        for path in sorted(folder.glob("*.yaml")):
            case = yaml.safe_load(path.read_text()) or {}
            log = f"{case.get('title', '')}\n{case.get('log') or ''}"
            inputs.append((path.name, diagnose.offline_facts(report=case.get("env_report") or "", log=log)))
    differ = 0
    for name, facts in inputs:
        if old.evaluate(facts, kb).model_dump_json() != new.evaluate(facts, kb).model_dump_json():
            differ += 1
            print(f"differs: {name}")
    print(f"{len(inputs)} inputs, {differ} differ")
    return 1 if differ else 0


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
