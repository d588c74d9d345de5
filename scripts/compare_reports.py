"""Byte-for-byte: this checkout's reports against another checkout's, on every fixture and the reduced replica.

    python scripts/compare_reports.py --base /path/to/other/checkout [--work DIR] [--full-replica]

Builds every fixture (``python -m fixtures.generate DIR``) and the reduced 397B replica
(``python -m fixtures.replica DIR --layers 4 --experts 8 --shards 3``; ``--full-replica`` adds the full one)
with this checkout, then runs ``ckptinspect report REF --format json`` and ``--format text`` on each, once
per checkout (PYTHONPATH set to it, one interpreter per checkout, the CLI called in it), and compares
stdout, stderr and the exit status. Prints each difference and exits 1 when there is one. A refactor that
claims "the same reports" runs this against the commit it started from.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Runs in a fresh interpreter with the checkout first on sys.path: every report of argv[2:], through the
# CLI's own entry point, captured; one JSON object out.
RUNNER = r"""
import contextlib, io, json, sys
from ckptinspect.cli import main
out = {}
for ref in sys.argv[2:]:
    for fmt in ("json", "text"):
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                main(["report", ref, "--format", fmt, "--quiet"])
                code = 0
            except SystemExit as exc:
                code = exc.code
            except Exception as exc:  # the CLI's own handling is what is compared: record what escaped it
                code = f"raised {type(exc).__name__}: {exc}"
        out[f"{ref} --format {fmt}"] = [code, stdout.getvalue(), stderr.getvalue()]
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
"""


def build(work: Path, full: bool) -> list[str]:
    """Every fixture and the replica(s) under ``work``; their paths."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    fixtures, replica = work / "fixtures", work / "replica"
    if not fixtures.exists():
        subprocess.run([sys.executable, "-m", "fixtures.generate", str(fixtures)], cwd=ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL)
    if not replica.exists():
        subprocess.run([sys.executable, "-m", "fixtures.replica", str(replica), "--layers", "4", "--experts", "8",
                        "--shards", "3"], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    refs = sorted(str(p) for p in fixtures.iterdir() if p.is_dir() or p.suffix in (".gguf", ".json", ".gz"))
    refs += sorted(str(p) for p in replica.iterdir())
    if full:
        big = work / "replica-full"
        if not big.exists():
            subprocess.run([sys.executable, "-m", "fixtures.replica", str(big)], cwd=ROOT, env=env, check=True,
                           stdout=subprocess.DEVNULL)
        refs += sorted(str(p) for p in big.iterdir())
    return refs


def reports(checkout: Path, refs: list[str], out: Path) -> dict[str, list]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "COLUMNS": "120", "NO_COLOR": "1"}
    subprocess.run([sys.executable, "-c", RUNNER, str(out), *refs], cwd=str(checkout), env=env, check=True)
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="the other checkout (its repository root)")
    ap.add_argument("--work", type=Path, help="where the fixtures are built (default: a temporary directory)")
    ap.add_argument("--full-replica", action="store_true", help="also the full-scale replica (~371k tensors)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        refs = build(work, args.full_replica)
        ours = reports(ROOT, refs, Path(tmp) / "ours.json")
        base = reports(args.base.resolve(), refs, Path(tmp) / "base.json")
    differ = [key for key in base if base[key] != ours.get(key)] + [key for key in ours if key not in base]
    for key in differ:
        print(f"DIFFERS: {key}\n  base: {base.get(key)!r:.600}\n  ours: {ours.get(key)!r:.600}")
    failed = sum(1 for v in ours.values() if v[0] != 0)
    print(f"{len(ours)} reports ({len(refs)} refs x json/text; {failed} end with an error, compared too): "
          f"{len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
