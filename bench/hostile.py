"""Benchmark: the work hostile input costs, each case in a fresh child process.

    python bench/hostile.py [--mb 2]

For each reproduction of bounded work on untrusted input (redaction, regex engines, a
pasted report, a snapshot, a rule file, a fix template) it prints the wall time and the
child's peak resident memory. The target is linear work: doubling --mb should about double
the time of the size-driven cases, and none should pass 10 s or 500 MB at 10 MB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "redact: '://a:' repeated": "from probes.redact import redact; redact('://a:' * (N // 5))",
    "redact: 'password=' repeated": "from probes.redact import redact; redact('password=' * (N // 9))",
    "redact: a=b=c... chain": "from probes.redact import redact; redact('a=b=' * (N // 4))",
    "redact: '-' run": "from probes.redact import redact; redact('-' * N)",
    "redact+controls: OSC flood": "from probes.redact import redact, strip_controls; strip_controls(redact('\\x1b]' * (N // 2)))",
    "rule regex (a+)+$ on RE2": "from probes.patterns import compile; compile(r'(a+)+$').search('a' * N + 'b')",
    "look-around fallback, 3 repeats": "from probes.patterns import compile; p = compile(r'a*b*c*(?=x)'); [p.search('a' * 2000) for _ in range(N // 2000)]",
    "report: 'mpirun ' repeated": "from probes.offline import offline_facts; offline_facts(reports=[('r', 'mpirun ' * (N // 7))])",
    "report: 'a: b' lines": "from probes.report import parse_report; parse_report('a: b\\n' * (N // 5))",
    "snapshot: 10,000-deep JSON": "from probes.untrusted import load_json, InputError\ntry: load_json(b'[' * N, 'x')\nexcept InputError: pass",
    "snapshot: long JSON integer": "from probes.untrusted import load_json, InputError\ntry: load_json(b'[' + b'9' * N + b']', 'x')\nexcept InputError: pass",
    "rule file: YAML alias bomb": (
        "import tempfile, pathlib\nfrom diagnose.kb import load_kb, KBError\n"
        "d = pathlib.Path(tempfile.mkdtemp()); (d / 'a').mkdir()\n"
        "lines = ['a0: &a0 [x, x, x, x, x, x, x, x, x, x]'] + [f'a{i}: &a{i} [' + ', '.join([f'*a{i-1}'] * 10) + ']' for i in range(1, 9)]\n"
        "(d / 'a' / 'b.yaml').write_text('\\n'.join(lines))\n"
        "try: load_kb([d], shipped=False)\nexcept KBError: pass"
    ),
    "fix template: nested loops": (
        "from diagnose.templates import TEMPLATES, render_fix\n"
        "s = '{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}{% endfor %}{% endfor %}{% endfor %}'\n"
        "render_fix(s, TEMPLATES.from_string(s), {})"
    ),
}

CHILD = """
import resource, sys, time
sys.path.insert(0, {root!r})
N = {n}
start = time.perf_counter()
{code}
wall = time.perf_counter() - start
print(wall, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=2.0, help="size of the size-driven inputs in MB (default 2)")
    args = parser.parse_args()
    n = int(args.mb * 1_000_000)
    print(f"{'case':<36} {'wall s':>8} {'peak MiB':>9}")
    rows = []
    for name, code in CASES.items():
        child = CHILD.format(root=str(ROOT), n=n, code=code)
        out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=600, cwd=ROOT)
        if out.returncode != 0:
            print(f"{name:<36} failed: {out.stderr.strip().splitlines()[-1:]}")
            continue
        wall, rss_kb = out.stdout.split()
        rows.append({"case": name, "wall_s": round(float(wall), 3), "peak_mib": round(int(rss_kb) / 1024)})
        print(f"{name:<36} {float(wall):>8.3f} {int(rss_kb) / 1024:>9.0f}")
    print(json.dumps({"mb": args.mb, "rows": rows}))


if __name__ == "__main__":
    main()
