"""Run SGLang 0.5.23's own memory arithmetic on CPU, from the `--no-deps` install of tests/sglang_parser.py.

- `handle_gpu_memory_settings` (SG:arg_groups/memory_hook.py) picks chunked_prefill_size, the decode
  CUDA-graph max_bs and mem_fraction_static for a GPU size and TP. It reads a resolved ServerArgs
  view; here that view is a plain namespace holding SGLang's own CudaGraphConfig (decode FULL,
  prefill BREAKABLE: SGLang's defaults on CUDA), and the device-capacity probe returns the GPU size.
- `DefaultPoolConfigurator._compute_cell_size` (SG:model_executor/pool_configurator.py) gives the KV
  bytes per token per rank (MLA latent, GQA heads, DSA indexer). It is called unbound on namespaces
  standing in for the KV-cache configurator and the published parallel / memory / kernel settings.
  Its import chain names kernel, tokenizer and vision packages the `--no-deps` install lacks
  (STUBBED) and every model's config module; those are stand-ins that are never called.

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


_CELL = r"""
import importlib.abc, importlib.machinery, json, sys, types, warnings
warnings.simplefilter("ignore")
import torch

# Stand-ins for what the import chain names but the KV arithmetic never calls: kernel / vision /
# tokenizer packages the --no-deps install lacks, and model-specific config modules.
class _AnyAttr(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_class(f"{cls.__name__}.{name}")

def _stub_class(name):
    return _AnyAttr(name, (), {})

class _Any(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_class(name)

# Absent third-party packages only: a package this environment has is imported for real (a stand-in for an
# installed package would hide its API, e.g. transformers calling kernels' decorators with arguments).
ROOTS = {root for root in sys.argv[1].split(",") if importlib.machinery.PathFinder.find_spec(root) is None}
class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ROOTS or name in ROOTS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        m = _Any(spec.name); m.__path__ = []; return m
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, _Finder())
import sglang.srt
# sglang.srt.configs/__init__ imports every model's config class; register the package unexecuted.
_configs = types.ModuleType("sglang.srt.configs")
_configs.__path__ = [sglang.srt.__path__[0] + "/configs"]
_configs.__getattr__ = _stub_class
sys.modules["sglang.srt.configs"] = _configs
REAL = set(sys.argv[2].split(","))  # sglang.srt.configs submodules that really load
class _ConfigStubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        prefix = "sglang.srt.configs."
        if name.startswith(prefix) and name[len(prefix):].split(".")[0] not in REAL:
            return importlib.machinery.ModuleSpec(name, self)
        return None
    def create_module(self, spec):
        stub = types.ModuleType(spec.name)
        stub.__getattr__ = _stub_class
        return stub
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, _ConfigStubs())
import sglang.srt.model_executor.pool_configurator as pc
import sglang.srt.layers.cp.utils as cpu
import sglang.srt.mem_cache.kv_cache_configurator as kcc
DTYPES = {"bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}
cases = json.load(sys.stdin)
out = []
for case in cases:
    par = types.SimpleNamespace(attn_tp_size=case["tp"], attn_dcp_size=1)
    pc.get_parallel = lambda par=par: par
    pc.get_glm_dsa_layer_split_effective_num_layers = lambda kvc, n: n
    cpu.get_glm_dsa_layer_split_effective_num_layers = lambda kvc, n: n
    cpu.get_glm_dsa_cp_layer_shard_info = lambda kvc: (0, 1)
    kcc.get_disagg = lambda: types.SimpleNamespace(disaggregation_mode="null")
    be = case.get("dsa_backend", "trtllm")
    exec_ = types.SimpleNamespace(kernel=types.SimpleNamespace(dsa_prefill_backend=be, dsa_decode_backend=be))
    kcc.get_exec = lambda e=exec_: e
    mem = types.SimpleNamespace(enable_hisparse=False, enable_unified_cache_external_linker=False,
                                enable_hierarchical_cache=False)
    kcc.get_memory = lambda m=mem: m
    pc.get_memory = lambda m=mem: m
    hf = types.SimpleNamespace(**case["hf"])
    kv_heads = case["hf"].get("num_key_value_heads") or 1
    mc = types.SimpleNamespace(hf_config=hf, kv_lora_rank=case["hf"].get("kv_lora_rank"),
                               qk_rope_head_dim=case["hf"].get("qk_rope_head_dim"),
                               head_dim=case["hf"].get("head_dim"), v_head_dim=case["hf"].get("head_dim"),
                               get_num_kv_heads=lambda tp, dcp=1, k=kv_heads: max(1, k // tp))
    layers = case["layers"]
    kvc = types.SimpleNamespace(model_config=mc, kv_cache_dtype=DTYPES[case["kv_dtype"]], use_mla_backend=case["mla"],
                                server_args=types.SimpleNamespace(enable_hisparse=False), is_draft_worker=False,
                                layer_info=types.SimpleNamespace(start_layer=0, end_layer=layers), mambaish_config=None,
                                kv_cache_dtype_str=case["kv_dtype"])
    me = types.SimpleNamespace(kv_cache_dtype_str=case["kv_dtype"], _compute_dsa_indexer_cell_size=lambda **kw: pc.DefaultPoolConfigurator._compute_dsa_indexer_cell_size(me, **kw), _compute_qsa_cell_size=pc.DefaultPoolConfigurator._compute_qsa_cell_size)
    out.append(pc.DefaultPoolConfigurator._compute_cell_size(me, kvc, layers))
print(json.dumps(out))
"""

STUBBED = ("tvm_ffi", "sentencepiece", "compressed_tensors", "gguf", "flashinfer", "sgl_kernel", "deep_gemm",
           "xgrammar", "outlines", "llguidance", "partial_json_parser", "openai", "fastapi", "uvicorn", "uvloop",
           "setproctitle", "interegular", "torchao", "modelscope", "hf_transfer", "blobfile", "tiktoken", "einops",
           "timm", "decord", "soundfile", "av", "cuda", "nvidia", "pynvml", "zmq", "sglang_router", "mooncake",
           "nixl", "quack", "cutlass", "apache_tvm_ffi", "kernels")
REAL_CONFIGS = ("model_config", "hybrid_arch", "load_config", "device_config", "modelopt_config", "utils",
                "deepseek_v41", "deepseek_v4", "model_config_parser_registry")


def sglang_cell_sizes(cases: list[dict]) -> list[int]:
    """[{hf: config keys, layers, tp, mla, kv_dtype, dsa_backend?}] -> SGLang's KV bytes per token per rank."""
    return _run(_CELL, cases, ",".join(STUBBED), ",".join(REAL_CONFIGS))


def _run(code: str, cases: list[dict], *argv: str) -> list:
    target = ensure_sglang()
    env = dict(os.environ, PYTHONPATH=str(target))
    proc = subprocess.run([sys.executable, "-c", code, *argv], input=json.dumps(cases),
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"SGLang memory subprocess failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sglang_memory_settings(cases: list[dict]) -> list[dict]:
    """[{gpu_mib, tp, mla, chunked?}] -> SGLang's [{mem_fraction_static, chunked_prefill_size, decode_max_bs}]."""
    return _run(_RUN, cases)
