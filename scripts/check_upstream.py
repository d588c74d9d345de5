"""What the newest releases of our dependencies would break: a separate check, never part of CI.

    python scripts/check_upstream.py [-- PYTEST ARGS]

It copies the checkout (the files git tracks) to a temporary folder, re-resolves every lock there with
scripts/lock.py (so the copy's locks name today's newest releases that the .in files allow), prints
what moved against the committed locks, then installs the copy's test environment into a fresh virtual
environment and runs the test suite there, engines included, with their environments in a temporary
cache of their own. The committed locks, the user's caches and this checkout are never touched.

Exit status: 0 when the suite passes on the newest releases (then `python scripts/lock.py` and a commit
bring them in), 1 when it fails (the summary names what moved, the place to look first).
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from lock import LOCKS  # noqa: E402


def pins(path: Path) -> list[str]:
    return sorted(line.split(" --hash", 1)[0] for line in path.read_text(encoding="utf-8").splitlines()
                  if line and not line.startswith("#"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder and print its path")
    parser.add_argument("pytest_args", nargs="*", default=["-n", "2"], help="arguments for pytest (default: -n 2)")
    opts = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="ckptinspect-upstream-"))
    copy = tmp / "checkout"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    copy.mkdir()
    subprocess.run(["cp", "--parents", "-t", str(copy), *files.decode().split("\0")[:-1]], cwd=ROOT, check=True)
    subprocess.run([sys.executable, str(copy / "scripts" / "lock.py")], cwd=copy, check=True)
    moved = []
    for lock in LOCKS:
        diff = list(difflib.unified_diff(pins(ROOT / lock.path), pins(copy / lock.path), lock.path,
                                         f"{lock.path} (newest)", lineterm="", n=0))
        moved += [line for line in diff[2:] if line[:1] in "+-"]
        print("\n".join(diff) if diff else f"{lock.path}: nothing newer")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--require-hashes", "--no-deps", "-r",
                    str(copy / "requirements" / "dev.lock")], check=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", str(copy)],
                   check=True)
    env = dict(os.environ, CKPTINSPECT_TEST_CACHE=str(tmp / "engine-cache"))
    env.pop("PYTHONPATH", None)
    status = subprocess.run([python, "-m", "pytest", *opts.pytest_args], cwd=copy, env=env).returncode
    print(f"\nnewest releases: the suite {'passed' if status == 0 else 'FAILED'}; "
          f"{len([m for m in moved if m.startswith('+')])} pins moved" + (f" (kept in {tmp})" if opts.keep else ""))
    if not opts.keep:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
