"""What a dry-load through an engine's own code answered (records only; render/verify_out.py renders them)."""

from __future__ import annotations

from dataclasses import dataclass

# The dry-load's outcome, worst last: every built parameter loaded as stored, with the dtype it was built
# with / the draft loads, but the engine built the target model itself as the draft (its class resolved
# from the target's own architecture) and no MTP tensor reached it: a second copy of the trunk, not an MTP
# head / a parameter is mis-loaded, never loaded or an MTP tensor was skipped / a step raised in the
# engine / a step could not run here.
OUTCOMES = ("loads", "target copy", "defects", "load failed", "not run")
TARGET_COPY = "target copy"


@dataclass(frozen=True)
class StepOutcome:
    step: str  # "speculative config", "draft config", "build draft on meta", "load weights", ...
    ok: bool
    seconds: float
    error: str | None = None  # the engine's exception: "ValueError: ..."
    where: str | None = None  # the engine's innermost frame: "vllm/...py:123 function"
    tensor: str | None = None  # the stored tensor being loaded when it raised
    platform: bool = False  # the engine refused this machine (no GPU / CUDA / CPU feature), not the checkpoint


@dataclass(frozen=True)
class ParameterOutcome:
    name: str  # the engine's parameter name (leaf only; the module is ModuleOutcome.module)
    dtype: str  # as built: "float8_e4m3fn", "bfloat16", "uint8", ...
    shape: tuple[int, ...]
    status: str  # loaded | mismatch | never loaded | shared (the target's) | default (the engine fills it) | unused (never read)
    calls: int  # weight-loader calls that reached it
    sources: tuple[str, ...]  # stored tensor names that reached it (first few)
    source_count: int
    problems: tuple[str, ...]
    note: str | None = None  # why shared / default / unused, citing the engine function


@dataclass(frozen=True)
class ModuleOutcome:
    module: str  # the engine's module path, e.g. "model.layers.61.mtp_block.self_attn.fused_qkv_a_proj"
    parameters: tuple[ParameterOutcome, ...]

    @property
    def status(self) -> str:
        order = ("never loaded", "mismatch", "loaded", "default", "unused", "shared")
        return min((p.status for p in self.parameters), key=order.index, default="loaded")


@dataclass(frozen=True)
class VerifyResult:
    ref: str
    location: str
    engine: str  # sglang | vllm
    engine_version: str | None  # the installed engine's version the answer is for
    python: str  # the engine's interpreter
    outcome: str  # one of OUTCOMES
    method: str | None  # the speculative method the engine ran ("mtp", ...)
    draft_architectures: tuple[str, ...]
    draft_class: str | None  # the module class the engine built ("DeepSeekMTP")
    quantization: str | None  # the draft's quantization method as the engine resolved it
    quant_config: str | None  # its quantization config class
    steps: tuple[StepOutcome, ...]
    modules: tuple[ModuleOutcome, ...]
    tensors_offered: int
    mtp_tensors_loaded: int
    mtp_tensors_skipped: tuple[str, ...]  # stored MTP tensors the engine's load_weights never used
    mtp_tensor_targets: tuple[tuple[str, tuple[str, ...]], ...]  # stored MTP tensor -> engine parameters it loaded into
    other_tensors_loaded: tuple[str, ...]  # non-MTP stored tensors the draft took (shared embedding, ...)
    other_tensors_skipped: int
    shims: tuple[str, ...]  # platform checks replaced for the dry-load, each with why
    not_run: tuple[str, ...]  # steps of a real load not run here, each with why
    seconds: float  # wall time of the engine subprocess
    # the architectures the engine reads for the TARGET model (its own model config, built before the
    # draft's, as the engine's target worker does); empty when the script stopped before reading them
    target_architectures: tuple[str, ...] = ()

    @property
    def draft_is_target(self) -> bool:
        """The engine's draft architecture is the target's own (no draft architecture took its place), so
        the engine built the target model's class as the draft."""
        return bool(self.target_architectures) and self.draft_architectures[:1] == self.target_architectures[:1]
