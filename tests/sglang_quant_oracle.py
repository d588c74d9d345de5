"""Ask SGLang 0.5.23's own quantization config classes, on CPU, what they build for a module.

For each case, ``QuantizationConfig.from_config(config)`` of the method's class (SGLang's registry,
python/sglang/srt/layers/quantization/__init__.py ``get_quantization_config``) is built, and its
``get_quant_method(layer, prefix)`` is called for a Linear (``ReplicatedLinear``) or a fused MoE
(``FusedMoE``) layer object. The answer is the class name of the method SGLang returns ("quantized"
unless it is an ``Unquantized*`` method or None), or the error SGLang raises (e.g. the fused-shard
"Detected some but not all shards" ValueError).

What is not SGLang's own code here, and why:
- the layer objects are created without their ``__init__`` (which needs a CUDA device and a process
  group); ``get_quant_method`` only tests their class with ``isinstance`` before deciding;
- the quantized methods' and schemes' constructors are replaced by stand-ins that record their class
  name: several probe the GPU (``ModelOptNvFp4FusedMoEMethod`` raises "Current platform does not support NVFP4" on a
  CPU) after the decision has been taken;
- ``torch.cuda.get_device_capability`` and SGLang's ``get_device_capability`` answer SM100 (scheme
  checks ask them after the decision);
- ``packed_modules_mapping`` is set as the model loader sets it (the case's ``packed``, the model class's);
- for a hybrid FP8 + NVFP4 case (``hybrid_nvfp4``) the wrapping the model loader does
  (SG:model_loader/loader.py _get_quantization_config: HybridFp8NvFp4Config around the Fp8Config, its NVFP4
  exclude list extended by model.decoder.* and stages.*) is restated, since the loader needs a ModelConfig;
- modules that only GPU kernels or other serving parts import are stubbed (``STUBBED``), and
  transformers is imported first so that it keeps seeing torchvision as absent.

The SGLang install is the one tests/sglang_parser.py makes; the few pure-Python packages the
quantization modules import besides (tests/locks/sglang-0.5.23-quant-deps.lock) go into a sibling
directory once (tests/engine_envs.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.sglang_parser import announce, ensure_sglang

STUBBED = ("tvm_ffi", "torchvision", "sentencepiece", "gguf", "loguru",
           "sglang.srt.multimodal.internvl_utils")

# The start of every script the tests run in SGLang's environment (this oracle, the registry check of
# tests/test_engine_architectures.py): stand-in modules for the packages named in sys.argv[1] that the
# environment lacks, and for named SGLang submodules, before SGLang is imported.
SGLANG_STUB_PRELUDE = r"""
import importlib.abc, importlib.machinery, json, logging, sys, types, warnings
warnings.simplefilter("ignore")
import transformers.utils.import_utils as iu
iu.is_torchvision_available()
import transformers.models.auto.image_processing_auto  # noqa: F401  (caches "no torchvision")
# A third-party package is stood in for only where this environment lacks it (an installed one is imported
# for real, so the API SGLang meets is the installed version's); a named SGLang submodule always is.
STUBBED = {name for name in sys.argv[1].split(",")
           if "." in name or importlib.machinery.PathFinder.find_spec(name) is None}

class _Any(types.ModuleType):
    __path__ = []
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Any(f"{self.__name__}.{name}")
    def __call__(self, *a, **k):
        return a[0] if len(a) == 1 and callable(a[0]) and not k else _Any("call")
    def __mro_entries__(self, bases):
        return (object,)
    def __getitem__(self, key):
        return _Any(f"{self.__name__}[]")
    def __iter__(self):
        return iter(())
    def __bool__(self):
        return False

class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name in STUBBED or name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        return _Any(spec.name)
    def exec_module(self, module):
        pass

sys.meta_path.insert(0, _Stubs())
"""

_ORACLE = SGLANG_STUB_PRELUDE + r"""
import torch
torch.cuda.get_device_capability = lambda *a, **k: (10, 0)  # scheme checks ask it; no decision does
import sglang.srt.layers.quantization as q
# imported inside HybridFp8NvFp4Config.get_quant_method: loaded now so that its method gets a stand-in too
import sglang.srt.layers.quantization.mxfp4_flashinfer_trtllm_moe  # noqa: F401
from sglang.srt.layers.quantization.modelopt_quant import HybridFp8NvFp4Config, ModelOptFp4Config
from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
from sglang.srt.layers.quantization.base_config import QuantizeMethodBase
from sglang.srt.layers.quantization.base_scheme import BaseLinearScheme, BaseMoEScheme

def stand_in(cls):
    # ModelSlim's MoE path reads each scheme's `kernel` right after choosing it
    return type(cls.__name__, (cls,), {"__init__": lambda self, *a, **k: None, "kernel": None})

# Every quantized method class the config modules can return, replaced where the configs look it up.
for mod in list(sys.modules.values()):
    if getattr(mod, "__name__", "").startswith("sglang.srt.layers.quantization"):
        for name, value in list(vars(mod).items()):
            if isinstance(value, type) and issubclass(value, (QuantizeMethodBase, BaseLinearScheme, BaseMoEScheme)) \
                    and value not in (QuantizeMethodBase, BaseLinearScheme, BaseMoEScheme) \
                    and not name.startswith("Unquantized"):
                setattr(mod, name, stand_in(value))

# The hybrid path's MXFP4 MoE method is no QuantizeMethodBase (its constructor reads the runtime config).
_mxfp4 = sys.modules["sglang.srt.layers.quantization.mxfp4_flashinfer_trtllm_moe"]
_mxfp4.Mxfp4FlashinferTrtllmMoEMethod = stand_in(_mxfp4.Mxfp4FlashinferTrtllmMoEMethod)

# Scheme checks ask the device capability after the decision (None on a CPU): answer SM100 there too.
for mod in list(sys.modules.values()):
    if getattr(mod, "__name__", "").startswith("sglang.srt.layers.quantization") \
            and callable(getattr(mod, "get_device_capability", None)):
        mod.get_device_capability = lambda *a, **k: (10, 0)

def layer(kind):
    obj = object.__new__(ReplicatedLinear if kind == "linear" else FusedMoE)
    # sizes some methods read once the decision is taken (AutoRound's Marlin support check)
    obj.__dict__.update(use_triton_kernels=False, use_flashinfer_trtllm_moe=False, hidden_size=256,
                        intermediate_size_per_partition=256, num_experts=4, num_local_experts=4, top_k=2,
                        input_size=256, output_size=256, input_size_per_partition=256,
                        output_size_per_partition=256, output_partition_sizes=[256])
    return obj

out = []
for case in json.load(sys.stdin):
    try:
        # SG:model_loader/weight_utils.py get_quant_config writes the model's mapping into the config dict
        config = dict(case["config"], packed_modules_mapping=case.get("packed", {}))
        cfg = q.get_quantization_config(case["method"]).from_config(config)
    except Exception as exc:
        out.append({"error": f"from_config: {type(exc).__name__}: {exc}"})
        continue
    # The model loader hands the model class's packed_modules_mapping to the config
    # (SG:model_loader/loader.py _get_quantization_config).
    cfg.packed_modules_mapping = case.get("packed", {})
    hybrid = case.get("hybrid_nvfp4")
    if hybrid is not None:
        # SG:model_loader/loader.py _get_quantization_config, restated: with nvfp4_moe_meta set the Fp8Config
        # is wrapped, its NVFP4 exclude list being the checkpoint's ignore plus the MTP's runtime names.
        cfg.is_fp4_experts = hybrid["is_fp4_experts"]
        cfg = HybridFp8NvFp4Config(fp8_config=cfg, nvfp4_config=ModelOptFp4Config(
            is_checkpoint_nvfp4_serialized=True, group_size=hybrid["group_size"],
            exclude_modules=list(hybrid["exclude_modules"]) + ["model.decoder.*", "stages.*"],
            packed_modules_mapping=cfg.packed_modules_mapping))
    answers = {}
    for prefix, kind in case["modules"]:
        try:
            qm = cfg.get_quant_method(layer(kind), prefix)
            answers[prefix] = type(qm).__name__ if qm is not None else None
        except Exception as exc:
            answers[prefix] = f"!{type(exc).__name__}: {exc}"
    out.append(answers)
print(json.dumps(out))
"""


def ensure_quant_deps() -> Path:
    """The quantization modules' extra packages (tests/locks/sglang-0.5.23-quant-deps.lock), installed once."""
    from tests import engine_envs

    return engine_envs.ensure(engine_envs.SGLANG_QUANT_DEPS, announce)


def built(answer: str | None, kind: str = "linear") -> str:
    """``quantized`` / ``unquantized`` / ``error`` from one oracle answer. A fused MoE handed a Linear's
    ``UnquantizedLinearMethod`` (W8A8Int8Config does that for an ignored MoE) fails at startup: FusedMoE
    calls its ``create_weights`` with MoE keywords (SG:layers/moe/fused_moe_triton/layer.py
    FusedMoE.__init__), which that signature lacks."""
    if answer is not None and answer.startswith("!"):
        return "error"
    if kind == "moe" and answer == "UnquantizedLinearMethod":
        return "error"
    return "unquantized" if answer is None or answer.startswith("Unquantized") else "quantized"


def ask_sglang(cases: list[dict]) -> list[dict]:
    """Per case ``{"method", "config", "modules": [[prefix, "linear" | "moe"], ...]}``: SGLang's answer
    per prefix (the method class name, None, or ``"!Error: text"``)."""
    sglang, deps = ensure_sglang(), ensure_quant_deps()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(sglang), str(deps)]))
    proc = subprocess.run([sys.executable, "-c", _ORACLE, ",".join(STUBBED)], input=json.dumps(cases),
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"SGLang quantization oracle failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
