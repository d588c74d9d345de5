"""What one engine builds for each MTP module: parameters of the declared scheme, or unquantized ones.

Engines construct every Linear of the draft from the declared quantization, module by module, and
only then copy the checkpoint tensors in:

- a draft the rule builds unquantized as a whole (``draft_quant: unquantized``, e.g. SGLang's
  Qwen3.5 / DeepSeek NextN under modelopt_fp4) gets unquantized parameters everywhere;
- a module the engine's model code builds as a plain ``nn.Linear`` (``forced_unquantized``, e.g.
  ``eh_proj``) or as a vocabulary head (``shared_head.head``: ``ParallelLMHead``, which the FP8 /
  ModelOpt configs leave unquantized) is unquantized;
- otherwise the engine asks the declared exclude / ignore lists about the module (under its runtime
  name where the rule gives one: VL:model_executor/layers/quantization/modelopt.py
  ``is_layer_excluded``, compressed-tensors ``should_ignore_layer``) and builds the declared scheme
  unless a list covers it.

A stored tensor that disagrees with the parameter built for it does not load (a size mismatch, or a
KeyError for a scale the parameter lacks) or loads mis-read. This module answers the question once per
engine context; the conditions of rule files (readiness/conditions.py) read the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptinspect.inventory.mtp_prefix import concrete_prefix
from ckptinspect.readiness.versions import in_range
from ckptinspect.records import TensorGroup

if TYPE_CHECKING:
    from ckptinspect.readiness.conditions import EngineContext

UNQUANTIZED = frozenset({"bf16", "fp16", "fp32"})
# Components an engine never builds as a quantized Linear from the global scheme: routers are
# ReplicatedLinear(quant_config=None) in both engines, norms are not Linear, embeddings are shared
# from the target (mtp_families.md §5.3).
NOT_LINEAR = frozenset({"norm", "embedding", "lm_head", "router", "vision"})
# Why a module is built the way it is (ModuleBuild.reasons).
REASONS = ("undeclared", "draft", "forced", "head", "excluded", "quantized")


def is_linear_weight(g: TensorGroup) -> bool:
    """A stored Linear weight (2-D or grouped 3-D), not a companion, bias or norm."""
    return g.role in ("weight", "other") and len(g.shape) >= 2 and g.component not in NOT_LINEAR


def is_head_weight(g: TensorGroup) -> bool:
    """A vocabulary head inside the MTP layer (DeepSeek / GLM ``shared_head.head``)."""
    return g.role in ("weight", "other") and len(g.shape) >= 2 and g.component == "lm_head"


@dataclass(frozen=True)
class ModuleBuild:
    """One MTP weight group and what the engine builds for each of its members."""

    k: int  # MTP layer
    module: str  # module pattern with the layer index filled: "mtp.layers.0.mlp.experts.{}.gate_proj"
    relative: str | None  # the same relative to the layer base ("layers.0.mlp.experts.{}.gate_proj")
    component: str
    stored: str  # scheme of the stored tensors
    built: tuple[str | None, ...]  # per member: the declared label, None = unquantized
    reasons: tuple[str, ...]  # per member, one of REASONS

    @property
    def stored_quantized(self) -> bool:
        return self.stored not in UNQUANTIZED and self.stored != "other"

    @property
    def built_quantized(self) -> bool:
        """Some member gets parameters of the declared scheme."""
        return any(b is not None for b in self.built)

    @property
    def built_unquantized(self) -> bool:
        return any(b is None for b in self.built)


def member_modules(g: TensorGroup) -> list[str]:
    """Every member's module name: an exclude entry may name single experts (``...experts.1*``), so
    each member is asked (a few hundred names for a 256-expert MTP layer; answers are cached per
    checkpoint in Facts.excluded_cache, shared by every engine)."""
    slots = g.module.count("{}")
    if not slots:
        return [g.module]
    lead = [g.index] if g.index is not None else []
    return [g.module.format(*(lead + list(sub))[:slots]) for sub in sorted(g.sub_indices)]


def shown_module(g: TensorGroup) -> str:
    return g.module.replace("{}", str(g.index), 1) if g.index is not None else g.module


def forced_modules(ctx: "EngineContext") -> list[str]:
    """Relative modules the engine's model code builds unquantized at ``ctx.version``."""
    from ckptinspect.readiness.conditions import evaluate

    out: list[str] = []
    for entry in ctx.engine.forced_unquantized:
        if (entry.versions is None or in_range(ctx.version, entry.versions)) and evaluate(entry.when, ctx):
            out.extend(entry.modules)
    return out


def runtime_names(ctx: "EngineContext", name: str, k: int) -> list[str]:
    """``name`` under the engine's prefix renames (exclude lists are matched on these)."""
    layers = ctx.facts.checkpoint.config.num_hidden_layers
    out = []
    for rn in ctx.engine.runtime_names:
        source = concrete_prefix(rn.source, layers, k)
        if name.startswith(source):
            out.append(concrete_prefix(rn.target, layers, k) + name[len(source):])
    return out


def excluded(ctx: "EngineContext", name: str, k: int, names: str = "either") -> bool:
    """Whether the declared lists leave ``name`` unquantized for this engine.

    ``names``: ``checkpoint`` asks about the stored name, ``runtime`` about the engine's renamed
    module (every rename must be covered; the stored name when no rename applies), ``either``
    accepts both spellings (engine versions differ in which one they match: sgl-project/sglang PR #34906).
    """
    ask = ctx.facts.is_excluded
    ckpt = ask(name)
    renamed = [ask(r) for r in runtime_names(ctx, name, k)]
    runtime = all(renamed) if renamed else ckpt
    if names == "checkpoint":
        return ckpt
    if names == "runtime":
        return runtime
    return ckpt or runtime


def build_plan(ctx: "EngineContext", names: str = "either") -> list[ModuleBuild]:
    """Every MTP Linear / head weight group with what ``ctx``'s engine builds for it (cached per context)."""
    key = (names, ctx.draft_quant)
    cached = ctx._plans.get(key)
    if cached is not None:
        return cached
    facts = ctx.facts
    label = facts.checkpoint.declared.label
    forced = forced_modules(ctx) if label is not None else []
    out: list[ModuleBuild] = []
    for scan in facts.layers.values():
        for g in scan.groups:
            head = is_head_weight(g)
            if not (head or is_linear_weight(g)):
                continue
            modules = member_modules(g)
            rel = scan.relative(modules[0])
            shown = shown_module(g)
            built: list[str | None] = []
            reasons: list[str] = []
            for name in modules:
                reason = _reason(ctx, label, forced, scan.relative(name), head, name, scan.k, names)
                reasons.append(reason)
                built.append(label if reason == "quantized" else None)
            rel_shown = scan.relative(shown) if rel is not None else None
            out.append(ModuleBuild(k=scan.k, module=shown, relative=rel_shown, component=g.component,
                                   stored=g.scheme, built=tuple(built), reasons=tuple(reasons)))
    ctx._plans[key] = out
    return out


def _reason(ctx: "EngineContext", label: str | None, forced: list[str], rel: str | None, head: bool,
            name: str, k: int, names: str) -> str:
    if label is None:
        return "undeclared"
    if ctx.draft_quant == "unquantized":
        return "draft"
    if rel is not None and any(rel == m or rel.startswith(m + ".") for m in forced):
        return "forced"
    if head:
        return "head"
    if excluded(ctx, name, k, names):
        return "excluded"
    return "quantized"


def summary(plan: list[ModuleBuild]) -> tuple[tuple[str, str | None], ...]:
    """(module, built label or None) per group, for EngineVerdict.module_quantization."""
    out = []
    for m in plan:
        built = next((b for b in m.built if b is not None), None)
        out.append((m.module, built))
    return tuple(sorted(out))
