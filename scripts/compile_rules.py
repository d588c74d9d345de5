"""Write mirror.jsonl into rules/, the JSON mirror of the built-in rule files (ckptinspect/rules/mirror.py), in a
source checkout. It is a build output, never committed: a wheel gets its own from hatch_build.py (which
calls ``expected``), and a checkout without one reads every rule file from its YAML (same answers).

    python scripts/compile_rules.py           # write (or refresh) the mirror of this checkout
    python scripts/compile_rules.py --check   # exit 1 when this checkout's mirror is missing or stale

A stale mirror never changes an answer (a file whose sha256 differs is read from its YAML); it only
costs the YAML parse again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ckptinspect.rules.mirror import MIRROR, mirror_lines  # noqa: E402

RULES = ROOT / "rules"


def expected(rules: Path = RULES) -> bytes:
    """The mirror of every YAML file under ``rules``, as the wheel and a checkout hold it."""
    files = [p for p in rules.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()]
    return b"".join(line + b"\n" for line in mirror_lines(rules, files))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    target = RULES / MIRROR
    want = expected()
    if args.check:
        if not target.is_file() or target.read_bytes() != want:
            print(f"{target.relative_to(ROOT)} is missing or stale: run python scripts/compile_rules.py",
                  file=sys.stderr)
            return 1
        return 0
    target.write_bytes(want)
    print(f"wrote {target.relative_to(ROOT)} ({len(want.splitlines())} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
