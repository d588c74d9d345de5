"""Dry-load of a checkpoint's MTP draft through vLLM's own code, run by vLLM's Python (see _dryload_common.py).

The steps, each vLLM's own function unless named otherwise:
1. ``EngineArgs(..., speculative_config={"method": ..., "num_speculative_tokens": 1}).create_engine_config()``
   on a scratch directory holding only the checkpoint's JSON files: vLLM's speculative config picks the
   draft architecture and builds the draft's model config and quantization config.
2. ``EagleProposer._create_draft_vllm_config`` (v1/spec_decode/llm_base_proposer.py): the draft's config.
3. ``initialize_model`` (model_executor/model_loader/utils.py) under ``torch.device("meta")``, with a
   one-process gloo group: the draft module as ``get_model`` builds it, without memory or a GPU.
4. ``DefaultModelLoader.load_weights`` (model_executor/model_loader/default_loader.py) with its weight
   iterator replaced by the stored names, dtypes and shapes as meta tensors (the one substituted piece:
   where tensors come from); the model's own ``load_weights`` and vLLM's loaded-weights check run.
5. ``_maybe_share_embeddings`` / ``_maybe_share_lm_head`` (llm_base_proposer.py) against a stand-in target
   holding only an embedding and an LM head: which draft parameters vLLM replaces by the target's.
Not run: ``process_weights_after_loading`` (repacks data for kernels; meta tensors carry none).

Shim (named in the answer): vLLM's CPU FP8 linear kernels require AMX tiles
(model_executor/kernels/linear/scaled_mm/cpu.py ``is_supported``); the kernel is chosen while the layer is
built, so without AMX the FP8 draft cannot even be constructed. ``torch.cpu._is_amx_tile_supported``
answers True; no kernel ever runs.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _dryload_common as common  # noqa: E402


def main(request: dict, result: dict) -> None:
    scratch = tempfile.mkdtemp(prefix="model-", dir=SCRATCH)
    common.stub_missing(os.environ.get("CKPTINSPECT_VERIFY_STUB_MISSING", "").split(","), SCRATCH,
                        result["shims"], "CKPTINSPECT_VERIFY_STUB_MISSING; vLLM's multimodal model modules import "
                        "them at module level, the draft's construction and loading never call them")
    import torch
    import vllm

    result.update(engine="vllm", engine_version=getattr(vllm, "__version__", "unknown"), python=sys.executable)
    rows = common.request_rows(request)
    bad = common.unknown_dtypes(torch, rows)
    if bad:
        result["steps"].append({"step": "tensors", "ok": False,
                                "error": f"this torch has no dtype for {', '.join(bad)}", "where": ""})
        return
    if not torch.cpu._is_amx_tile_supported() or getattr(torch.cpu, "_ckptinspect_shim", False):
        torch.cpu._is_amx_tile_supported = lambda: True
        torch.cpu._ckptinspect_shim = True
        result["shims"].append("torch.cpu._is_amx_tile_supported -> True: vLLM's CPU FP8 kernel selection "
                               "(model_executor/kernels/linear/scaled_mm/cpu.py is_supported) requires AMX; "
                               "the kernel is only chosen, never run")

    from dataclasses import replace

    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.utils import get_draft_load_config, initialize_model
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.spec_decode.eagle import EagleProposer

    for name, doc in request["json_files"].items():
        with open(os.path.join(scratch, os.path.basename(name)), "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
    method = request.get("method") or "mtp"
    steps = result["steps"]
    with common.Step(steps, "speculative config"):
        args = EngineArgs(model=scratch, skip_tokenizer_init=True, enforce_eager=True, load_format="auto",
                          trust_remote_code=bool(request.get("trust_remote_code")),
                          speculative_config={"method": method, "num_speculative_tokens": 1})
        vllm_config = args.create_engine_config()
    if not steps[-1]["ok"]:
        return
    spec = vllm_config.speculative_config
    draft_model_config = spec.draft_model_config
    # the target's architectures as vLLM reads them (its model config), to tell a draft that is the
    # target model itself from an MTP head
    result["target_architectures"] = list(getattr(vllm_config.model_config.hf_config, "architectures", None) or [])
    result.update(method=spec.method, draft_architectures=list(getattr(draft_model_config.hf_config,
                                                                       "architectures", None) or []),
                  quantization=draft_model_config.quantization)
    with common.Step(steps, "draft config"):
        draft_config = EagleProposer._create_draft_vllm_config(
            types.SimpleNamespace(speculative_config=spec, vllm_config=vllm_config))
    if not steps[-1]["ok"]:
        return
    with common.Step(steps, "build draft on meta"):
        with set_current_vllm_config(draft_config):
            if not model_parallel_is_initialized():  # once per process (a batch of jobs shares it)
                init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                             distributed_init_method=f"file://{SCRATCH}/process-group")
                initialize_model_parallel(1, 1)
            with set_default_torch_dtype(draft_model_config.dtype), torch.device("meta"):
                model = initialize_model(vllm_config=draft_config, model_config=draft_model_config)
    if not steps[-1]["ok"]:
        return
    result["draft_class"] = type(model).__name__
    quant_config = getattr(model, "quant_config", None) or draft_config.quant_config
    result["quant_config"] = type(quant_config).__name__ if quant_config is not None else None
    recorder = common.Recorder(torch)
    recorder.instrument(model, default_weight_loader)
    # Models that call default_weight_loader by name (not through the parameter) are recorded too.
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("vllm.model_executor.models") \
                and getattr(module, "default_weight_loader", None) is default_weight_loader:
            module.default_weight_loader = recorder.wrap(default_weight_loader)
    with common.Step(steps, "load weights"):
        loader = DefaultModelLoader(get_draft_load_config(draft_config))
        loader.get_all_weights = lambda model_config, model: recorder.tensors(rows)
        with set_current_vllm_config(draft_config), set_default_torch_dtype(draft_model_config.dtype), \
                recorder.tracking():
            loader.load_weights(model, draft_model_config)
    if not steps[-1]["ok"]:
        steps[-1]["tensor"] = recorder.current
    shared: dict[str, str] = {}
    if steps[-1]["ok"]:
        with common.Step(steps, "share target embedding and LM head"):
            shared = _shared_with_target(torch, model, spec, vllm_config)
    result["parameters"] = common.check_parameters(model, recorder, shared, _engine_defaults(model))
    result["tensors"] = common.tensor_outcome(rows, recorder)
    result["not_run"] = ["process_weights_after_loading: repacks parameter data for the kernels; meta "
                         "tensors carry none"]


def _engine_defaults(model) -> dict[str, str]:
    """Parameters vLLM fills itself when the checkpoint has none: the KV-cache / attention scales of a
    BaseKVCacheMethod, set to 1.0 by its process_weights_after_loading
    (model_executor/layers/quantization/kv_cache.py)."""
    from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod

    out = {}
    for module_name, module in model.named_modules():
        if isinstance(getattr(module, "quant_method", None), BaseKVCacheMethod):
            for leaf, _ in module.named_parameters(recurse=False):
                out[f"{module_name}.{leaf}"] = ("vLLM uses 1.0 when the checkpoint has none (BaseKVCacheMethod."
                                                "process_weights_after_loading, quantization/kv_cache.py)")
    return out


def _shared_with_target(torch, model, spec, vllm_config) -> dict[str, str]:
    """Run vLLM's own sharing step against a stand-in target; the draft parameters it replaced."""
    from vllm.v1.spec_decode.eagle import EagleProposer

    before = dict(model.named_parameters())
    embed = before.get("model.embed_tokens.weight")
    heads = [p for n, p in before.items() if n.endswith("lm_head.weight") or n.endswith("shared_head.head.weight")]
    target = torch.nn.Module()
    target.model = torch.nn.Module()
    target.model.embed_tokens = torch.nn.Embedding(1, 1, device="meta")
    if embed is not None:
        target.model.embed_tokens.weight = torch.nn.Parameter(torch.empty_like(embed), requires_grad=False)
    target.lm_head = torch.nn.Module()
    target.lm_head.weight = torch.nn.Parameter(
        torch.empty_like(heads[0]) if heads else torch.empty(1, 1, device="meta"), requires_grad=False)
    proposer = _Proposer(model=model, speculative_config=spec, vllm_config=vllm_config, method=spec.method)
    for step in ("_maybe_share_embeddings", "_maybe_share_lm_head"):
        getattr(EagleProposer, step)(proposer, target)
    after = {id(p) for p in model.parameters()}
    shared = {}
    for name, param in before.items():
        if id(param) not in after:
            shared[name] = ("the target model's (vLLM's _maybe_share_embeddings / _maybe_share_lm_head replace "
                            "the draft's)")
    return shared


class _Proposer(types.SimpleNamespace):
    """The proposer's state the sharing functions read: the draft and the configs; every other flag off."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return False


SCRATCH = tempfile.mkdtemp(prefix="ckptinspect-verify-")  # scratch model directories (JSON files only)


def import_engine() -> None:
    """vLLM and the modules the steps use, imported before the request arrives; exit EXIT_ENGINE_MISSING
    when this Python has no working vLLM."""
    import importlib.util

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ["HF_HUB_OFFLINE"] = "1"  # the scratch directory is the model: nothing to fetch
    try:
        if importlib.util.find_spec("vllm") is None:  # answered before torch's slow import
            raise ImportError("No module named 'vllm'")
        import torch  # noqa: F401
        import vllm  # noqa: F401
        import vllm.engine.arg_utils  # noqa: F401
        import vllm.model_executor.model_loader.default_loader  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means this is no working vLLM environment
        sys.stderr.write(f"vllm cannot be imported by {sys.executable}: {type(exc).__name__}: {exc}\n")
        sys.exit(common.EXIT_ENGINE_MISSING)


if __name__ == "__main__":
    common.run(main, prepare=import_engine)
