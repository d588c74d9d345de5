"""Byte-for-byte: this checkout's reports against another checkout's, on every fixture and the reduced replica.

    python scripts/compare_reports.py --base /path/to/other/checkout [--work DIR] [--full-replica] [--plans]

Builds every fixture (``python -m fixtures.generate DIR``), the GGUF models (fixtures/gguf_models.py) and
the reduced 397B replica (``python -m fixtures.replica DIR --layers 4 --experts 8 --shards 3``;
``--full-replica`` adds the full one) with this checkout, then runs ``ckptinspect report REF --format json``
and ``--format text`` on each, once per checkout (PYTHONPATH set to it, one interpreter per checkout, the
CLI called in it), and compares stdout, stderr and the exit status. ``--plans`` adds ``ckptinspect plan
REF --gpu h100 --gpus 8 --format json`` (and ``--gpu rtx-5090`` for the GGUF models). Prints each
difference and exits 1 when there is one. A refactor that claims "the same reports" runs this against the
commit it started from.
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
commands = json.loads(sys.argv[2])
for argv in commands:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code
        except Exception as exc:  # the CLI's own handling is what is compared: record what escaped it
            code = f"raised {type(exc).__name__}: {exc}"
    out[" ".join(argv)] = [code, stdout.getvalue(), stderr.getvalue()]
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
"""


def build(work: Path, full: bool) -> tuple[list[str], list[str]]:
    """Every fixture, GGUF model and replica under ``work``: (safetensors refs, GGUF refs)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    fixtures, replica = work / "fixtures", work / "replica"
    if not fixtures.exists():
        subprocess.run([sys.executable, "-m", "fixtures.generate", str(fixtures)], cwd=ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL)
    if not replica.exists():
        subprocess.run([sys.executable, "-m", "fixtures.replica", str(replica), "--layers", "4", "--experts", "8",
                        "--shards", "3"], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    gguf = work / "gguf"
    if not gguf.exists():
        subprocess.run([sys.executable, "-m", "fixtures.gguf_models", str(gguf)], cwd=ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL)
    refs = sorted(str(p) for p in fixtures.iterdir() if p.is_dir() or p.suffix in (".gguf", ".json", ".gz"))
    refs += sorted(str(p) for p in replica.iterdir())
    ggufs = sorted(str(p) for p in gguf.iterdir())
    if full:
        big = work / "replica-full"
        if not big.exists():
            subprocess.run([sys.executable, "-m", "fixtures.replica", str(big)], cwd=ROOT, env=env, check=True,
                           stdout=subprocess.DEVNULL)
        refs += sorted(str(p) for p in big.iterdir())
    return refs, ggufs


def commands(refs: list[str], ggufs: list[str], plans: bool) -> list[list[str]]:
    out = [["report", ref, "--format", fmt, "--quiet"] for ref in refs + ggufs for fmt in ("json", "text")]
    if plans:
        out += [["plan", ref, "--gpu", "h100", "--gpus", "8", "--format", "json", "--quiet"] for ref in refs]
        out += [["plan", ref, "--gpu", gpu, "--gpus", "1", "--format", fmt, "--quiet"]
                for ref in ggufs for gpu in ("h100", "rtx-5090") for fmt in ("json", "text")]
    return out


def reports(checkout: Path, argvs: list[list[str]], out: Path) -> dict[str, list]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "COLUMNS": "120", "NO_COLOR": "1"}
    subprocess.run([sys.executable, "-c", RUNNER, str(out), json.dumps(argvs)], cwd=str(checkout), env=env,
                   check=True)
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="the other checkout (its repository root)")
    ap.add_argument("--work", type=Path, help="where the fixtures are built (default: a temporary directory)")
    ap.add_argument("--full-replica", action="store_true", help="also the full-scale replica (~371k tensors)")
    ap.add_argument("--plans", action="store_true", help="also plans (8x H100; the GGUF models on one card)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        refs, ggufs = build(work, args.full_replica)
        argvs = commands(refs, ggufs, args.plans)
        ours = reports(ROOT, argvs, Path(tmp) / "ours.json")
        base = reports(args.base.resolve(), argvs, Path(tmp) / "base.json")
    differ = [key for key in base if base[key] != ours.get(key)] + [key for key in ours if key not in base]
    for key in differ:
        print(f"DIFFERS: {key}\n  base: {base.get(key)!r:.600}\n  ours: {ours.get(key)!r:.600}")
    failed = sum(1 for v in ours.values() if v[0] != 0)
    print(f"{len(ours)} commands ({len(refs) + len(ggufs)} refs; {failed} end with an error, compared too): "
          f"{len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
