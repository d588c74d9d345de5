"""Run SGLang 0.5.23's own memory arithmetic on CPU, from the `--no-deps` install of tests/sglang_parser.py.

- `handle_gpu_memory_settings` (SG:arg_groups/memory_hook.py) picks chunked_prefill_size, the decode
  CUDA-graph max_bs and mem_fraction_static for a GPU size and TP. It reads a resolved ServerArgs
  view; here that view is a plain namespace holding SGLang's own CudaGraphConfig (decode FULL,
  prefill BREAKABLE: SGLang's defaults on CUDA), and the device-capacity probe returns the GPU size.
- The KV pool's per-token cell size (SG:model_executor/pool_configurator.py _compute_cell_size) is not
  run here: importing that module pulls in sgl-kernel communication ops (tvm_ffi), which a CPU
  machine without the kernels cannot import.

Everything SGLang computes runs in its code; only what it would read from a live GPU is supplied.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sglang_parser import ensure_sglang

_RUN = r"""
import json, sys, types, warnings
warnings.simplefilter("ignore")
import sglang.srt.arg_groups.memory_hook as mh
import sglang.srt.arg_groups.cuda_graph_hook as cgh
from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig

def view(case):
    ns = types.SimpleNamespace(
        device="cuda", tp_size=case["tp"], pp_size=1, chunked_prefill_size=case.get("chunked"),
        max_running_requests=None, max_total_tokens=None, model_path="m", mem_fraction_static=None,
        language_only=False, language_model_only=False, disaggregation_mode="null", max_prefill_tokens=16384,
        speculative_num_draft_tokens=None, speculative_algorithm=None, disable_cuda_graph_padding=False,
        enable_symm_mem=False, attn_dp_size=1, torch_compile_max_bs=None, moe_a2a_backend="none",
        cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend=Backend.FULL),
                                          prefill=PhaseConfig(backend=Backend.BREAKABLE)))
    ns._cuda_graph_config_locked = set()
    return ns

def declare(server_args, _who, **values):
    for k, v in values.items():
        setattr(server_args, k, v)

cases = json.load(sys.stdin)
out = []
for case in cases:
    sa = view(case)
    patches = {
        "resolving_view": lambda s: s, "resolved_view": lambda s: s, "declare_resolution": declare,
        "get_device_memory_capacity": lambda device, mib=case["gpu_mib"]: mib,
        "model_config_of": lambda s: types.SimpleNamespace(is_multimodal=False),
        "post_capture_kv_sizing_planned": lambda s: False,
        "use_mla_backend": lambda s, mla=case["mla"]: mla,
        "attn_dp_enabled_of": lambda s: False,
        "get_platform": lambda: types.SimpleNamespace(is_xpu=False),
    }
    for mod in (mh, cgh):
        for name, fn in patches.items():
            if hasattr(mod, name):
                setattr(mod, name, fn)
    mh.handle_gpu_memory_settings(sa)
    out.append({"mem_fraction_static": sa.mem_fraction_static, "chunked_prefill_size": sa.chunked_prefill_size,
                "decode_max_bs": sa.cuda_graph_config.decode.max_bs})
print(json.dumps(out))
"""


def _run(code: str, cases: list[dict]) -> list:
    target = ensure_sglang()
    env = dict(os.environ, PYTHONPATH=str(target))
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(cases),
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"SGLang memory subprocess failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sglang_memory_settings(cases: list[dict]) -> list[dict]:
    """[{gpu_mib, tp, mla, chunked?}] -> SGLang's [{mem_fraction_static, chunked_prefill_size, decode_max_bs}]."""
    return _run(_RUN, cases)
