"""The engine-independent half of a dry-load, run inside the engine's own Python environment.

This file is executed by the engine's interpreter (never imported by ckptinspect), next to
``vllm_dryload.py`` / ``sglang_dryload.py``: it imports only the standard library and torch (which every
engine environment has), never anything from ckptinspect.

Protocol: the request is one JSON object on stdin (``config``, ``json_files``, ``tensors`` as
``[name, safetensors dtype, shape, is_mtp]`` rows); the answer is one line on stdout that starts with
``ANSWER_MARK``, so engine log lines on stdout never mix with it.

Why the loaders are instrumented: a meta tensor has no data, so ``copy_`` from a BF16 meta tensor into an
FP8 meta parameter of the same shape succeeds silently, and a fused expert parameter that received 255 of
its 256 experts' scales looks loaded to the engine. Every call of a parameter's ``weight_loader`` is
recorded with (shard, expert, dtype, shape) and checked against the parameter afterwards.
"""

from __future__ import annotations

import json
import re
import sys
import time
import traceback
from typing import Any, Callable, Iterator

from _dryload_stubs import stub_missing  # noqa: E402,F401  (the engine scripts call common.stub_missing)

ANSWER_MARK = "@@ckptinspect-verify "
PLATFORM_REFUSAL = re.compile(r"(?i)current platform does not support|not compiled with cuda|cuda is not available|"
                              r"no cuda gpus|requires (amx|cuda|a gpu)|found no nvidia driver|"
                              r"requires platform support|"
                              # vLLM's MoE kernel oracles (fused_moe/oracle/*.py) choose among the GPU kernels of
                              # this machine: none on a CPU, or on a GPU arch without one, is the machine's answer
                              r"no \w+ moe backend supports|"
                              # vLLM's CPU platform: DSA sparse attention (platforms/cpu.py:150
                              # get_attn_backend_cls), DeepSeek-V4 MTP (models/deepseek_v4/cpu/mtp.py:18), and a
                              # forced GPU-only linear kernel (kernels/linear/nvfp4/marlin.py:27 "Marlin FP4 not
                              # available" on a machine without CUDA)
                              r"not supported on cpu|not implemented on cpu|marlin fp4 not available|"
                              # vLLM's fused MoE on a platform that is neither CUDA-alike nor XPU: non-gated
                              # (relu2) experts, e.g. Nemotron-H's (fused_moe/config.py:1399-1404 in 0.32.0)
                              r"is supported only for cuda|"
                              # vLLM's model registry says this when the model's module fails to import in this
                              # environment (a missing package such as torchvision, in vLLM's log): the
                              # environment's answer, not the checkpoint's (registry.py _raise_for_unsupported)
                              r"failed to be inspected|"
                              # SGLang's counterpart: its registry skipped the module that defines the
                              # architecture because the import failed here (sglang_dryload.py _unimportable)
                              r"does not import in this environment")
# An exception raised inside the engine's CPU-only code path (a function named ``*_cpu``) is the CPU
# port's limit, not the checkpoint's: e.g. SGLang 0.5.23 layers/rotary_embedding/factory.py:478
# get_rope_cpu asserts "Only deepseek_yarn is supported for CPU for now" (DeepSeek-V4's RoPE).
CPU_ONLY_FRAME = re.compile(r" \w+_cpu$")
EXIT_ENGINE_MISSING = 3  # the engine package cannot be imported: the environment is not the engine's
EXIT_INTERNAL = 4  # the dry-load script itself failed (a bug here, not an answer about the checkpoint)

# safetensors dtype -> torch dtype attribute (those torch names; a missing one is reported, not guessed)
TORCH_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
    "U16": "uint16", "U32": "uint32", "U64": "uint64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz", "F4": "float4_e2m1fn_x2",
}
# Parameter dtypes that hold quantized codes or scales in a fixed format: loading another dtype into one is
# a reinterpretation, never a conversion (BF16 values copied into an FP8 parameter are not FP8 codes).
CODE_DTYPES = {"float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float8_e4m3fnuz", "float8_e5m2fnuz",
               "uint8", "int8", "int32", "uint32", "int16", "uint16", "int64", "float4_e2m1fn_x2", "bool"}


def read_request() -> dict:
    """The request from stdin: msgspec where the engine's environment has it (vLLM and SGLang both depend
    on it; 4x faster than json on a 400B-class request), else json: the same value either way."""
    data = sys.stdin.buffer.read()
    try:
        from msgspec.json import decode
    except ImportError:
        return json.loads(data)
    try:
        return decode(data)
    except Exception:  # noqa: BLE001 - msgspec.DecodeError: json decides (and words a ValueError)
        return json.loads(data)


def request_rows(request: dict) -> list:
    """``(name, dtype, shape, is_mtp)`` per stored tensor, in order: from the columnar request
    (``tensor_names`` / ``tensor_kinds`` / ``tensor_kind``, ckptinspect/verify/request.py), or the row
    form ``tensors`` as given. Tensors of one kind share one shape list (nothing here mutates it)."""
    if "tensor_names" not in request:
        return request["tensors"]
    kinds = [(dtype, shape, bool(mtp)) for dtype, shape, mtp in request["tensor_kinds"]]
    return [(name, *kinds[k]) for name, k in zip(request["tensor_names"], request["tensor_kind"])]


def answer(payload: dict) -> None:
    sys.stdout.write(ANSWER_MARK + json.dumps(payload) + "\n")
    sys.stdout.flush()


def dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


class Step:
    """One named step of the dry-load: its outcome and time, and the engine's exception text if any."""

    def __init__(self, steps: list, name: str) -> None:
        self.steps, self.name = steps, name

    def __enter__(self) -> "Step":
        self.start = time.perf_counter()
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        entry = {"step": self.name, "ok": exc is None, "seconds": round(time.perf_counter() - self.start, 3)}
        if exc is not None:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["where"] = _engine_frame(tb)
            # the engine refusing THIS machine (no GPU / CUDA / a CPU feature), not the checkpoint
            entry["platform"] = bool(PLATFORM_REFUSAL.search(entry["error"]) or CPU_ONLY_FRAME.search(entry["where"] or ""))
        self.steps.append(entry)
        return exc is None or isinstance(exc, Exception)  # the engine's exception is the answer; Ctrl-C is not


def _engine_frame(tb) -> str:
    """The innermost frame of the engine's own code: file (below site-packages) and line, function."""
    frames = traceback.extract_tb(tb)
    for frame in reversed(frames):
        path = frame.filename.replace("\\", "/")
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in path:
                return f"{path.split(marker, 1)[1]}:{frame.lineno} {frame.name}"
    last = frames[-1] if frames else None
    return f"{last.filename}:{last.lineno} {last.name}" if last else ""


class Recorder:
    """Every weight-loader call: the stored tensor being loaded, the parameter, shard and expert ids, and the
    loaded tensor's dtype and shape (after any slicing the model's ``load_weights`` did)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.current: str | None = None  # the stored tensor name the iterator handed out last
        self.calls: dict[str, list[dict]] = {}  # parameter name -> records
        self.loaded_from: dict[str, set[str]] = {}  # stored tensor name -> parameter names it reached
        self.names: dict[int, str] = {}  # id(parameter) -> its name
        self.param_items: list = []
        self.provenance: dict[int, tuple] = {}  # id(meta tensor) -> (tensor, stored names it came from)
        self.mode: Any = None  # the provenance mode while tracking() is active

    def sources_of(self, tensor: Any) -> list[str]:
        """The stored tensors ``tensor`` was computed from (a loader may receive a concatenation of two
        stored tensors, e.g. SGLang's fused q_a / kv_a projection), else the one handed out last."""
        entry = self.provenance.get(id(tensor))
        if entry is not None and entry[0] is tensor and entry[1]:
            return sorted(entry[1])
        return [self.current] if self.current is not None else []

    def tracking(self) -> Any:
        """A context with a TorchFunctionMode that carries each stored tensor's name through every torch op
        (views, cat, slicing) to the tensors computed from it. ``tensors`` takes it off the stack while the
        engine handles a non-MTP tensor (most of a large checkpoint), where its per-op cost buys nothing."""
        import contextlib

        import torch
        from torch.overrides import TorchFunctionMode

        recorder = self

        class Provenance(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                names: set = set()

                def collect(value):
                    if isinstance(value, torch.Tensor):
                        entry = recorder.provenance.get(id(value))
                        if entry is not None and entry[0] is value:
                            names.update(entry[1])
                    elif isinstance(value, (list, tuple)):
                        for item in value:
                            collect(item)

                collect(args)
                collect(list((kwargs or {}).values()))
                if names:
                    for value in (out if isinstance(out, (list, tuple)) else (out,)):
                        if isinstance(value, torch.Tensor) and value.device.type == "meta":
                            recorder.provenance[id(value)] = (value, frozenset(names))
                return out

        @contextlib.contextmanager
        def active():
            mode = Provenance()
            torch._C._push_on_torch_function_stack(mode)
            recorder.mode = mode
            try:
                yield
            finally:
                recorder.mode = None
                if self._mode_on_top(torch, mode):
                    torch._C._pop_torch_function_stack()

        return active()

    @staticmethod
    def _mode_on_top(torch: Any, mode: Any) -> bool:
        depth = torch._C._len_torch_function_stack()
        return depth > 0 and torch._C._get_function_stack_at(depth - 1) is mode

    def wrap(self, loader: Callable, fallback_name: str | None = None) -> Callable:
        recorder = self

        def recording_loader(param, loaded_weight, *args, **kwargs):
            name = recorder.names.get(id(param), fallback_name or "?")
            if len(args) >= 3:  # FusedMoE.weight_loader(param, w, weight_name, shard_id, expert_id)
                shard, expert = args[1], args[2]
            else:
                shard = kwargs.get("shard_id", args[1] if "expert_id" in kwargs and len(args) > 1 else
                                   (args[0] if args and "expert_id" not in kwargs else None))
                expert = kwargs.get("expert_id")
            sources = recorder.sources_of(loaded_weight)
            record = {"tensor": sources[0] if sources else None, "sources": sources, "shard": None if shard is None else str(shard),
                      "expert": None if expert is None else int(expert),
                      "dtype": dtype_name(getattr(loaded_weight, "dtype", "?")),
                      "shape": list(getattr(loaded_weight, "shape", ())),
                      "numel": int(loaded_weight.numel()) if hasattr(loaded_weight, "numel") else 0}
            try:
                result = loader(param, loaded_weight, *args, **kwargs)
            except Exception as exc:
                record["error"] = f"{type(exc).__name__}: {exc}"
                recorder.calls.setdefault(name, []).append(record)
                raise
            if result is False and kwargs.get("return_success"):
                record["declined"] = True  # the loader answered "not mine" (expert not on this rank)
            recorder.calls.setdefault(name, []).append(record)
            if not record.get("declined"):
                for source in sources:
                    recorder.loaded_from.setdefault(source, set()).add(name)
            return result

        recording_loader.__wrapped__ = loader
        return recording_loader

    def instrument(self, model: Any, default_loader: Callable) -> None:
        self.param_items = list(model.named_parameters())
        for name, param in self.param_items:
            self.names[id(param)] = name
            loader = getattr(param, "weight_loader", None)
            wrapped = self.wrap(loader if loader is not None else default_loader)
            try:
                param.weight_loader = wrapped
            except AttributeError:  # a read-only property over _weight_loader (SGLang's parameter classes)
                param._weight_loader = wrapped

    def tensors(self, rows: list) -> Iterator[tuple[str, Any]]:
        """(name, meta tensor) in the order given, as the engine's safetensors iterator yields them.

        The provenance mode is off while the engine handles a run of non-MTP tensors: popped before the
        first of the run, pushed back before the next MTP tensor is made (or after the last tensor). No
        engine code runs between handing out one tensor and asking for the next, so this is the same as
        popping and pushing around each one, without two stack operations per tensor (x371k)."""
        torch = self.torch
        dtypes = {code: getattr(torch, attr) for code, attr in TORCH_DTYPES.items() if hasattr(torch, attr)}
        untracked = torch._C.DisableTorchFunction  # creating them needs no provenance (the mode's cost, x371k)
        empty, meta = torch.empty, torch.device("meta")
        pop, push = torch._C._pop_torch_function_stack, torch._C._push_on_torch_function_stack
        provenance, getrefcount = self.provenance, sys.getrefcount
        popped = None  # the provenance mode, while this generator has it off for non-MTP tensors
        for name, dtype, shape, is_mtp in rows:
            self.current = name
            if popped is not None and is_mtp:
                if self.mode is popped:
                    push(popped)
                popped = None
            with untracked():
                tensor = empty(shape, dtype=dtypes[dtype], device=meta)
            provenance[id(tensor)] = (tensor, frozenset((name,)))
            if popped is None and not is_mtp:
                mode = self.mode
                if mode is not None and self._mode_on_top(torch, mode):
                    pop()  # a non-MTP tensor: a loader that takes it gets it whole (its name is `current`)
                    popped = mode
            yield name, tensor
            # Kept only while the engine holds it (buffered for a fused load): here, the provenance entry
            # and getrefcount's argument are the only other references.
            if getrefcount(tensor) <= 3:
                provenance.pop(id(tensor), None)
            del tensor
        if popped is not None and self.mode is popped:
            push(popped)
        self.current = None


def unknown_dtypes(torch: Any, rows: list) -> list[str]:
    return sorted({dtype for _, dtype, _, _ in rows
                   if dtype not in TORCH_DTYPES or not hasattr(torch, TORCH_DTYPES[dtype])})


def shard_names(param_name: str, gated: bool = True) -> tuple[str, ...] | None:
    """The (shard) ids a fused-expert parameter expects per expert: w13 holds w1 and w3 (w1 alone for
    non-gated experts, e.g. Nemotron-H's relu2 up_proj), w2 holds w2."""
    leaf = param_name.rsplit(".", 1)[-1]
    if leaf.startswith("w13_") or leaf.startswith("w13"):
        return ("w1", "w3") if gated else ("w1",)
    if leaf.startswith("w2_") or leaf == "w2":
        return ("w2",)
    return None


def _gated_experts(model: Any, param_name: str) -> bool:
    """Whether the fused-expert module owning ``param_name`` is gated (w13 = w1 + w3), as the engine built it:
    SGLang's FusedMoE keeps ``moe_runner_config.is_gated`` (0.5.23 layers/moe/fused_moe_triton/layer.py:804-808
    loads w1 alone into w13 when it is False); vLLM 0.32.0 refuses non-gated experts on this CPU platform before
    any load (fused_moe/config.py:1399-1404), so it is not read here. Gated when the flag is not found."""
    try:
        module = model.get_submodule(param_name.rsplit(".", 1)[0])
    except AttributeError:  # torch's get_submodule: a name the module tree does not resolve; gated, the default
        return True
    value = getattr(getattr(module, "moe_runner_config", None), "is_gated", None)
    return value if isinstance(value, bool) else True


def check_parameters(model: Any, recorder: Recorder, shared: dict[str, str],
                     defaults: dict[str, str] | None = None, unused: dict[str, str] | None = None) -> list[dict]:
    """Each built parameter with what reached it and what is wrong with that, in the model's order.
    ``unused``: parameters the engine's own code never reads (status ``unused`` when nothing loaded them)."""
    out = []
    for name, param in recorder.param_items:
        dtype = dtype_name(param.dtype)
        records = [r for r in recorder.calls.get(name, []) if not r.get("declined")]
        problems: list[str] = []
        for record in records:
            if record.get("error"):
                problems.append(f"loader raised {record['error']} for {record['tensor']}")
            if record["dtype"] != dtype and (dtype in CODE_DTYPES or record["dtype"] in CODE_DTYPES):
                problems.append(f"{record['tensor']} stored {record['dtype']} loaded into a {dtype} parameter")
        experts = {r["expert"] for r in records if r["expert"] is not None}
        fused = shard_names(name, _gated_experts(model, name))
        if records and experts and fused is not None and param.dim() >= 1:
            expected = {(shard, e) for shard in fused for e in range(int(param.shape[0]))}
            got = {(r["shard"], r["expert"]) for r in records if r["expert"] is not None}
            missing = sorted(expected - got, key=lambda item: (item[1], item[0]))
            if missing:
                shown = ", ".join(f"expert {e} {s}" for s, e in missing[:4])
                more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
                problems.append(f"{len(missing)} of {len(expected)} (shard, expert) slots never loaded: {shown}{more}")
        elif records and not experts:
            # each shard's last load counts (a tensor loaded twice, e.g. a tied embedding, replaces itself)
            last: dict = {}
            for record in records:
                last[record["shard"]] = record["numel"]
            loaded, total = sum(last.values()), int(param.numel())
            if None in last and len(last) == 1:
                if loaded not in (total, 1):
                    problems.append(f"{loaded} of {total} elements loaded")
            elif loaded != total:
                problems.append(f"{loaded} of {total} elements loaded over shards {sorted(map(str, last))}")
        defaults = defaults or {}
        unused = unused or {}
        if name in shared:
            status = "shared"
        elif not records and name in defaults:
            status = "default"
        elif not records and name in unused:
            status = "unused"
        elif not records:
            status = "never loaded"
        elif problems:
            status = "mismatch"
        else:
            status = "loaded"
        sources = sorted({source for r in records for source in r.get("sources", ())})
        out.append({"name": name, "dtype": dtype, "shape": list(param.shape), "status": status,
                    "calls": len(records), "sources": sources[:3], "source_count": len(sources),
                    "problems": problems[:8],
                    "note": shared.get(name) or ((defaults.get(name) or unused.get(name)) if not records else None)})
    return out


def tensor_outcome(rows: list, recorder: Recorder) -> dict:
    """Loaded and skipped stored tensors: every MTP-flagged one by name, the others counted."""
    loaded_mtp, skipped_mtp, loaded_other = [], [], []
    skipped_other = 0
    for name, _dtype, _shape, is_mtp in rows:
        reached = name in recorder.loaded_from
        if is_mtp:
            (loaded_mtp if reached else skipped_mtp).append(name)
        elif reached:
            loaded_other.append(name)
        else:
            skipped_other += 1
    targets = {name: sorted(recorder.loaded_from[name]) for name in loaded_mtp}
    return {"offered": len(rows), "loaded_mtp": loaded_mtp, "skipped_mtp": skipped_mtp,
            "loaded_other": loaded_other, "skipped_other": skipped_other, "mtp_targets": targets}


def run(main: Callable[[dict, dict], None], prepare: Callable[[], None] | None = None) -> None:
    """``prepare()`` (the engine's imports: the caller reads the headers meanwhile), then read the request,
    call ``main(request, result)`` for it (or for each of its ``jobs``, in this one process: the engine is
    imported once), answer; a failure of this script exits EXIT_INTERNAL."""
    import gc

    if prepare is not None:
        prepare()
    # The engine's imports leave millions of objects; every full collection while the request's ~371k
    # names and meta tensors are made would walk them all and find nothing (the request's rows alone took
    # seconds that way). The collector is off from here on and runs once between the jobs of a batch (its
    # memory stays bounded). Nothing the engine does depends on it.
    gc.disable()
    try:
        request = read_request()
    except ValueError as exc:
        answer({"internal_error": f"the request is not JSON: {exc}"})
        sys.exit(EXIT_INTERNAL)
    jobs = request.get("jobs")
    results = []
    for i, job in enumerate(jobs if jobs is not None else [request]):
        if i:
            gc.collect()
        result: dict = {"steps": [], "shims": []}
        try:
            main(job, result)
        except SystemExit:
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the caller as this script's failure
            result["internal_error"] = f"{type(exc).__name__}: {exc}"
            result["traceback"] = traceback.format_exc()[-3000:]
            if jobs is None:
                answer(result)
                sys.exit(EXIT_INTERNAL)
        results.append(result)
    answer({"results": results} if jobs is not None else results[0])
