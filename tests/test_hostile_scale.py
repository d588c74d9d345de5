"""Legal-looking metadata at a scale that turns a quadratic step into a hang (issue 26, hostile round 3:
resource exhaustion within the caps). Each case runs in a child process under a generous timeout: the
timeout is a hang guard (the quadratic code took minutes), never a claim about speed; the times are in
BENCHMARKS.md."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Far above the linear reader's time on a loaded 2-core machine (a few seconds) and far below the
# quadratic one's (list.index per shard: 8 s at 20,000 shards, ~200 s at 100,000 on the same machine).
HANG_GUARD_S = 90


def test_a_snapshot_of_100000_headers_is_read_without_a_quadratic_step(tmp_path):
    """main before 2010031 sorted `file_sizes` by `order.index(shard)`: O(n^2) in the shard count."""
    n = 100_000
    shards = [f"model-{i:06d}-of-{n:06d}.safetensors" for i in range(n)][::-1]  # not sorted: order matters
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})
    doc = {"format": "ckptinspect-snapshot", "format_version": 1,
           "source": {"ref": "org/many", "kind": "hub", "location": "org/many", "revision": None},
           "files": ["config.json", *shards], "shards": shards, "json_files": {},
           "file_sizes": {s: 8 + len(header) + 4 for s in sorted(shards)}, "headers": {s: header for s in shards}}
    path = tmp_path / "many.json.gz"
    with gzip.open(path, "wt", compresslevel=1) as fh:
        json.dump(doc, fh)
    code = ("import json, sys\nfrom ckptinspect.sources.snapshot import read_snapshot\n"
            "raw = read_snapshot(sys.argv[1])\n"
            "print(json.dumps({'headers': list(raw.headers), 'sizes': list(raw.file_sizes)}))\n")
    env = {k: v for k, v in os.environ.items() if k != "CKPTINSPECT_DEBUG"}
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    # the source's shard order is kept for the headers and the file sizes alike
    assert out["headers"] == shards and out["sizes"] == shards
