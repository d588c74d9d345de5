"""Dry-load of a checkpoint's MTP / NextN draft through SGLang's own code, run by SGLang's Python (see
_dryload_common.py).

The steps, each SGLang's own function unless named otherwise:
1. ``ServerArgs(model_path=<scratch dir with the checkpoint's JSON files>, speculative_algorithm="NEXTN",
   device="cpu")`` and ``runtime_context.publish(..., role="scheduler")``, as a scheduler process does
   (managers/scheduler.py run_scheduler_process), for one rank.
2. ``ModelConfig.from_server_args(server_args)`` for the target (its architectures, as the target worker
   reads them), then ``ModelConfig.from_server_args(server_args, is_draft_model=True)``
   (configs/model_config.py): the draft architecture (``_config_draft_model``) and the draft's quantization.
   An architecture ``_config_draft_model`` does not rename stays the target's: the draft is then the
   target model itself (outcome ``target copy`` when no MTP tensor reaches it).
3. ``_get_quantization_config`` (model_loader/loader.py): the quantization config, with the model class's
   packed-modules mapping.
4. ``init_distributed_environment`` + ``initialize_model_parallel`` (one gloo rank), then
   ``_initialize_model`` under ``set_default_torch_dtype`` and ``torch.device("meta")``, as
   ``DefaultModelLoader.load_model`` does.
5. ``DefaultModelLoader.load_weights_only`` with the stored names, dtypes and shapes as meta tensors (the
   one substituted piece: where tensors come from): the model's own ``load_weights``.
6. ``set_embed_and_head`` with a stand-in target's embedding and LM head where the draft class has it (the
   speculative worker's sharing step): which draft parameters SGLang replaces by the target's; then
   ``should_apply_lm_head_quant_method`` (layers/logits_processor.py) on the draft's head: whether SGLang
   reads the head's own quantization parameters at all once its weight is the target's.
Not run: ``DefaultModelLoader.postprocess_weights`` (process_weights_after_loading: kernel repacking).

Stand-ins (named in the answer): modules that only GPU kernels or other serving parts import are empty
stand-in modules (``STUBBED``, as tests/sglang_quant_oracle.py does), among them ``vllm``: SGLang's CPU
rotary embedding imports vLLM's custom op while it is built (layers/rotary_embedding/base.py), never called
here.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _dryload_common as common  # noqa: E402

# uvicorn / fastapi: the HTTP server packages, imported at module level by distributed/gated_launch.py, which
# model_executor/model_runner.py imports and the Mamba / hybrid-attention models (models/nemotron_h.py through
# layers/attention/hybrid_linear_attn_backend.py) import in turn
STUBBED = ["tvm_ffi", "torchvision", "sentencepiece", "gguf", "loguru", "vllm", "uvicorn", "fastapi"]
SCRATCH = tempfile.mkdtemp(prefix="ckptinspect-verify-")
SHIMS: list[str] = []


def import_engine() -> None:
    import importlib.util

    try:
        if importlib.util.find_spec("sglang") is None:
            raise ImportError("No module named 'sglang'")
        missing = [name for name in STUBBED if importlib.util.find_spec(name) is None]
        common.stub_missing(missing, SCRATCH, SHIMS, "imported by SGLang's GPU kernels and serving parts at module "
                            "level (vllm: the CPU rotary embedding's custom op; uvicorn / fastapi: the HTTP "
                            "server); the draft's construction and "
                            "loading never call them")
        import torch  # noqa: F401
        import sglang  # noqa: F401
        import sglang.srt.model_loader.loader  # noqa: F401
        import sglang.srt.server_args  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means this is no working SGLang environment
        sys.stderr.write(f"sglang cannot be imported by {sys.executable}: {type(exc).__name__}: {exc}\n")
        sys.exit(common.EXIT_ENGINE_MISSING)


def main(request: dict, result: dict) -> None:
    import torch
    import sglang

    result["shims"].extend(SHIMS)
    result.update(engine="sglang", engine_version=getattr(sglang, "__version__", "unknown"), python=sys.executable)
    rows = common.request_rows(request)
    bad = common.unknown_dtypes(torch, rows)
    if bad:
        result["steps"].append({"step": "tensors", "ok": False,
                                "error": f"this torch has no dtype for {', '.join(bad)}", "where": ""})
        return
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.distributed.parallel_state import model_parallel_is_initialized
    from sglang.srt.model_loader.loader import DefaultModelLoader, _get_quantization_config, _initialize_model
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    from sglang.srt.model_loader.weight_utils import default_weight_loader
    from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank
    from sglang.srt.server_args import ServerArgs

    scratch = tempfile.mkdtemp(prefix="model-", dir=SCRATCH)
    for name, doc in request["json_files"].items():
        with open(os.path.join(scratch, os.path.basename(name)), "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
    steps = result["steps"]
    method = request.get("method") or "NEXTN"
    # No radix cache: for hybrid Mamba / linear-attention models SGLang's automatic radix-cache strategy
    # asserts that the platform can snapshot Mamba state (arg_groups/mamba_hook.py
    # validate_mamba_extra_buffer), which a CPU cannot; the cache is a scheduler structure that never
    # reaches the draft's construction or its weight loading.
    result["shims"].append("disable_radix_cache=True in ServerArgs (a scheduler cache; on CPU the Mamba "
                           "extra-buffer check would refuse hybrid models before the draft is built)")
    # The speculative settings of the command the rules print for SGLang (rules/families/*.yaml
    # engines.sglang.flags: --speculative-num-steps 3 --speculative-eagle-topk 1
    # --speculative-num-draft-tokens 4); DeepSeek-V4 asserts topk == 1 under EAGLE
    # (arg_groups/deepseek_v4_hook.py:155-158), which SGLang's automatic choice does not give.
    with common.Step(steps, "server args"):
        server_args = ServerArgs(model_path=scratch, speculative_algorithm=method, device="cpu",
                                 speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                                 trust_remote_code=bool(request.get("trust_remote_code")), skip_tokenizer_init=True,
                                 disable_cuda_graph=True, disable_radix_cache=True)
        publish(server_args, role="scheduler", ranks=SpawnRanks(
            world_rank=spawn_world_rank(server_args, tp_rank=0, pp_rank=0), dp_rank=None, gpu_id=0))
    if not steps[-1]["ok"]:
        return
    # The target's model config first, as the scheduler builds the target worker before the draft's
    # (managers/tp_worker.py _init_model_config): the architecture SGLang serves. The draft config below may
    # rewrite the same hf_config object in place (configs/model_config.py _config_draft_model), so the
    # target's list is copied now. A draft whose architecture is still the target's is the target model.
    with common.Step(steps, "target model config"):
        target_config = ModelConfig.from_server_args(server_args, model_path=scratch)
        result["target_architectures"] = list(target_config.hf_config.architectures or [])
    if not steps[-1]["ok"]:
        return
    with common.Step(steps, "draft model config"):
        model_config = ModelConfig.from_server_args(
            server_args, model_path=server_args.speculative_draft_model_path or scratch, is_draft_model=True)
    if not steps[-1]["ok"]:
        return
    result.update(method=method, draft_architectures=list(model_config.hf_config.architectures or []),
                  quantization=model_config.quantization)
    load_config = LoadConfig()
    with common.Step(steps, "quantization config"):
        try:
            quant_config = _get_quantization_config(model_config, load_config)
        except ValueError as exc:
            # the engine's frame stays the innermost one (common.Step names where the engine stopped)
            raise _unimportable(exc, list(model_config.hf_config.architectures or [])).with_traceback(
                exc.__traceback__) from exc
    if not steps[-1]["ok"]:
        return
    result["quant_config"] = type(quant_config).__name__ if quant_config is not None else None
    with common.Step(steps, "build draft on meta"):
        if not model_parallel_is_initialized():  # once per process (a batch of jobs shares it)
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"file://{SCRATCH}/process-group")
            initialize_model_parallel()
        with set_default_torch_dtype(model_config.dtype), torch.device("meta"):
            model = _initialize_model(model_config, load_config, quant_config)
    if not steps[-1]["ok"]:
        return
    result["draft_class"] = type(model).__name__
    recorder = common.Recorder(torch)
    recorder.instrument(model, default_weight_loader)
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("sglang.srt.models") \
                and getattr(module, "default_weight_loader", None) is default_weight_loader:
            module.default_weight_loader = recorder.wrap(default_weight_loader)
    with common.Step(steps, "load weights"):
        with set_default_torch_dtype(model_config.dtype), recorder.tracking():
            DefaultModelLoader.load_weights_only(model, recorder.tensors(rows), torch.device("meta"))
    if not steps[-1]["ok"]:
        steps[-1]["tensor"] = recorder.current
    shared: dict[str, str] = {}
    unused: dict[str, str] = {}
    if steps[-1]["ok"] and hasattr(model, "set_embed_and_head"):
        with common.Step(steps, "share target embedding and LM head"):
            shared = _shared_with_target(torch, model, rows, model_config.dtype)
            unused = _unused_head_parameters(torch, model, shared)
        result["shims"].append("torch.cuda.empty_cache / synchronize -> no-op during set_embed_and_head (it frees "
                               "GPU memory after the swap; there is no GPU here)")
    result["parameters"] = common.check_parameters(model, recorder, shared, _engine_defaults(model), unused)
    result["tensors"] = common.tensor_outcome(rows, recorder)
    result["not_run"] = ["postprocess_weights (process_weights_after_loading): repacks parameter data for the "
                         "kernels; meta tensors carry none"]
    if steps[-1]["ok"] and not hasattr(model, "set_embed_and_head") and method in ("NEXTN", "EAGLE"):
        # NEXTN is EAGLE (arg_groups/speculative_hook.py _resolve_speculative_algorithm_alias), whose draft
        # worker calls set_embed_and_head without asking (speculative/eagle_worker_v2.py:378,
        # EagleDraftWorker.init_lm_head, from alloc_memory_pool): a class without it stops the server there.
        result["not_run"].append(f"set_embed_and_head: {type(model).__name__} has none, and SGLang's EAGLE draft "
                                 "worker calls it for every NEXTN / EAGLE draft (speculative/eagle_worker_v2.py "
                                 "EagleDraftWorker.init_lm_head): the server would stop there with AttributeError "
                                 "after loading the draft")


def _unimportable(exc: ValueError, architectures: list[str]) -> ValueError:
    """SGLang's model registry skips a model module whose import fails ("Ignore import error when loading
    ...", models/registry.py:127-132 import_model_classes in 0.5.23) and then looks the architecture up in
    Transformers (model_loader/utils.py:155 resolve_transformers_arch), whose "not a registered model"
    error hides the cause. When one of SGLang's own model modules defines the architecture and does not import
    here, that is the environment's answer (a package the test environment lacks), said in the error's own
    words; otherwise the engine's error stands (SGLang has no such class)."""
    import importlib
    import importlib.util
    import re

    if "is not a registered model in the Transformers library" not in str(exc):
        return exc
    spec = importlib.util.find_spec("sglang.srt.models")
    for directory in (spec.submodule_search_locations or []) if spec else []:
        for path in sorted(os.listdir(directory)):
            if not path.endswith(".py"):
                continue
            with open(os.path.join(directory, path), encoding="utf-8") as fh:
                text = fh.read()
            arch = next((a for a in architectures if re.search(rf"^class {re.escape(a)}\b", text, re.M)), None)
            if arch is None:
                continue
            module = f"sglang.srt.models.{path[:-3]}"
            try:
                importlib.import_module(module)
            except Exception as cause:  # noqa: BLE001 - any import failure is the environment's answer
                return ValueError(f"{exc} ({module}, which defines {arch}, does not import in this environment: "
                                  f"{type(cause).__name__}: {cause})")
    return exc


def _engine_defaults(model) -> dict[str, str]:
    """Attention k_scale / v_scale SGLang keeps at their built value when the checkpoint has none
    (layers/radix_attention.py RadixAttention: 1.0 unless a kv-cache scale is loaded)."""
    out = {}
    for name, _ in model.named_parameters():
        if name.endswith((".k_scale", ".v_scale")) and ".attn" in name:
            out[name] = "SGLang keeps 1.0 when the checkpoint has no KV-cache scale (RadixAttention)"
    return out


def _shared_with_target(torch, model, rows, dtype) -> dict[str, str]:
    """The speculative worker hands the target's embedding and LM head to the draft
    (``set_embed_and_head``): the draft parameters it replaced.

    The stand-in target head has the stored ``lm_head.weight``'s columns (rows padded like the draft's), and
    its dtype where that holds codes (a float head is the model dtype, as the target builds it): a draft whose own head is built quantized
    (SGLang's DeepSeek NextN builds ``lm_head`` with the checkpoint's quant config) still receives the
    target's head as the target holds it, which decides how SGLang computes the draft's logits
    (``_unused_head_parameters``). Without a stored head (tied embeddings) the draft's own head stands in."""
    before = dict(model.named_parameters())
    embed = next((p for n, p in before.items() if n.endswith("embed_tokens.weight")), None)
    head = next((p for n, p in before.items() if n.endswith("lm_head.weight")), None)
    stored = next(((d, shape) for name, d, shape, is_mtp in rows if name == "lm_head.weight" and not is_mtp), None)
    target_embed = torch.empty_like(embed) if embed is not None else torch.empty(1, 1, device="meta")
    if stored is not None:
        code = common.TORCH_DTYPES[stored[0]]
        target_dtype = dtype if code in ("bfloat16", "float16", "float32", "float64") else getattr(torch, code)
        # rows as the draft's head has them (the vocabulary padded per rank, as the target pads its own)
        shape = (int(head.shape[0]), *stored[1][1:]) if head is not None and len(stored[1]) == 2 else tuple(stored[1])
        target_head = torch.empty(shape, dtype=target_dtype, device="meta")
    else:
        target_head = torch.empty_like(head) if head is not None else torch.empty(1, 1, device="meta")
    saved = torch.cuda.empty_cache, torch.cuda.synchronize
    # set_embed_and_head frees the draft's copies on the GPU and synchronizes: no GPU here
    torch.cuda.empty_cache = torch.cuda.synchronize = lambda *a, **k: None
    try:
        model.set_embed_and_head(target_embed, target_head)
    finally:
        torch.cuda.empty_cache, torch.cuda.synchronize = saved
    after = {id(p) for p in model.parameters()}
    return {name: "the target model's (SGLang's set_embed_and_head replaces the draft's)"
            for name, param in before.items() if id(param) not in after}


def _unused_head_parameters(torch, model, shared: dict[str, str]) -> dict[str, str]:
    """The draft LM head's own parameters that SGLang never reads once ``set_embed_and_head`` gave it the
    target's float weight: its logits processor applies the head's quant method only when the weight is in
    that method's layout (layers/logits_processor.py should_apply_lm_head_quant_method, 0.5.23:1599-1663:
    "Some draft models share an unquantized target lm_head tensor while still carrying the draft model's
    stale ModelOpt quant_method"), else it multiplies by ``lm_head.weight`` alone. Asked through that
    function; only for a float shared weight, because for a quantized one its answer depends on attributes
    process_weights_after_loading sets, which the dry-load does not run."""
    head = getattr(model, "lm_head", None)
    weight = getattr(head, "weight", None)
    if weight is None or not any(name.endswith("lm_head.weight") for name in shared) \
            or weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return {}
    from sglang.srt.layers.logits_processor import should_apply_lm_head_quant_method

    method = getattr(head, "quant_method", None)
    if should_apply_lm_head_quant_method(head, method):
        return {}
    prefix = next(name for name, module in model.named_modules() if module is head)
    note = (f"never read: SGLang computes the draft's logits from the target's shared {common.dtype_name(weight.dtype)} "
            f"weight and skips the head's {type(method).__name__} (layers/logits_processor.py "
            "should_apply_lm_head_quant_method)")
    return {f"{prefix}.{name}": note for name, _ in head.named_parameters() if f"{prefix}.{name}" not in shared}


if __name__ == "__main__":
    common.run(main, prepare=import_engine)
