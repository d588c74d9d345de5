"""The floor for `report`: read the index and every shard header and JSON-parse them, nothing else.

Usage: python benchmarks/floor_read_headers.py MODEL_DIR
"""

import json
import os
import struct
import sys
import time

start = time.perf_counter()
directory = sys.argv[1]
with open(os.path.join(directory, "model.safetensors.index.json"), "rb") as handle:
    index = json.loads(handle.read())
tensors = 0
for shard in dict.fromkeys(index["weight_map"].values()):
    with open(os.path.join(directory, shard), "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        tensors += len(json.loads(handle.read(length))) - 1  # minus __metadata__
for name in ("config.json", "hf_quant_config.json"):
    path = os.path.join(directory, name)
    if os.path.exists(path):
        with open(path, "rb") as handle:
            json.loads(handle.read())
print(f"{tensors} tensors in {time.perf_counter() - start:.3f} s")
