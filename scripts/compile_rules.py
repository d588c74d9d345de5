"""Write rules/mirror.jsonl, the JSON mirror of the built-in rule files (ckptinspect/rules/mirror.py).

    python scripts/compile_rules.py           # rewrite the mirror after editing a rule file
    python scripts/compile_rules.py --check   # exit 1 when it is stale (tests/test_rules_mirror.py)

A stale mirror never changes an answer (a file whose sha256 differs is read from its YAML); it only
costs the YAML parse again, which the test catches.
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


def expected() -> bytes:
    files = [p for p in RULES.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()]
    return b"".join(line + b"\n" for line in mirror_lines(RULES, files))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    target = RULES / MIRROR
    want = expected()
    if args.check:
        if not target.is_file() or target.read_bytes() != want:
            print(f"{target.relative_to(ROOT)} is stale: run python scripts/compile_rules.py", file=sys.stderr)
            return 1
        return 0
    target.write_bytes(want)
    print(f"wrote {target.relative_to(ROOT)} ({len(want.splitlines())} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
