#!/usr/bin/env bash
# The probe's GPU acceptance run (issue 33): every probe mode through the CLI, each in a fresh process
# (greedy, teacher on a 400 KB real-text corpus, layer-streamed at three budgets on the full-width
# Qwen3.5-397B layout, synthetic, --engine when an engine is installed), one table on stdout, the
# numbers appended to BENCHMARKS.md with the GPU's name, the date and the commit.
#
#   scripts/gpu_acceptance.sh [OUT_DIR] [extra args of benchmarks/probe_acceptance.py, e.g. --parts dense]
#
# Needs one CUDA GPU with >= 70 GiB free, ~45 GB of free disk under $PROBE_BENCH_WORK (default
# /tmp/probe-acceptance), and ckptinspect with its 'probe' extra importable by python3.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$here/benchmarks/results/acceptance-$(date -u +%Y%m%d-%H%M%S)}"
shift || true
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA GPU visible to torch: nothing to accept")'
exec python3 "$here/benchmarks/probe_acceptance.py" --out "$out" "$@"
