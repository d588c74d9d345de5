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
KeyError for a scale the parameter lacks) or loads mis-read. The answer is computed once per checkpoint
and set of build inputs (draft rule result, forced modules, runtime names) and read by the rule
conditions (readiness/conditions.py, readiness/quant_conditions.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ckptinspect.inventory.mtp_prefix import concrete_prefix
from ckptinspect.quant.crosscheck import NOT_LINEAR as CROSSCHECK_NOT_LINEAR
from ckptinspect.quant.detect import UNQUANTIZED
from ckptinspect.quant.engine_decision import ERROR, QUANTIZED, UNKNOWN, decide
from ckptinspect.quant.members import members_to_ask, module_names
from ckptinspect.readiness.context import holds
from ckptinspect.readiness.versions import in_range
from ckptinspect.records import TensorGroup
from ckptinspect.readiness.module_quant import module_quant_rules

if TYPE_CHECKING:
    from ckptinspect.readiness.context import EngineContext
    from ckptinspect.readiness.model import FamilyRule

# Components an engine never builds as a quantized Linear from the global scheme in a draft: those that
# are no Linear at all (quant/crosscheck.py NOT_LINEAR), plus routers (ReplicatedLinear(quant_config=None)
# in both engines), the head and vision parts, which the draft shares from the target
# (mtp_families.md §5.3).
NOT_LINEAR = CROSSCHECK_NOT_LINEAR | {"lm_head", "router", "vision"}
# Why a module is built the way it is (ModuleBuild.reasons).
# ``load_error``: the engine's quantization config raises for the module (rules/quant/<engine>.yaml).
REASONS = ("undeclared", "draft", "forced", "head", "excluded", "quantized", "load_error")


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
    built: tuple[str | None, ...]  # per member (one entry when the whole group is built alike): label or None
    reasons: tuple[str, ...]  # the same, one of REASONS
    causes: tuple[str, ...] = ()  # the same: the config entry / rule responsible (engine-modelled methods)
    engine_module: str | None = None  # the module as the engine asks about it (fused Linear, whole MoE)
    # (member module, stored scheme) of every member, in member order, when the members are stored in
    # different schemes (TensorGroup.member_schemes); ``built`` then has one entry per member, or one for all.
    stored_each: tuple[tuple[str, str], ...] = ()

    @property
    def stored_quantized(self) -> bool:
        return _quantized(self.stored)

    def members(self) -> list[tuple[str | None, str, str | None]]:
        """(member module or None, stored scheme, built label or None) per member asked: every member
        when they are stored differently (an engine builds one parameter for all of them and copies each
        stored tensor into its slot), else one row per entry of ``built``, stored as the group."""
        if not self.stored_each:
            return [(None, self.stored, b) for b in self.built]
        built = self.built if len(self.built) == len(self.stored_each) else self.built[:1] * len(self.stored_each)
        return [(name, stored, b) for (name, stored), b in zip(self.stored_each, built)]

    def unlike_stored(self) -> list[tuple[str | None, str, str | None]]:
        """The members built unlike they are stored: quantized parameters for an unquantized tensor or
        the reverse, or a member stored in another quantized scheme / dtype than its group, whose codes the
        engine copies into a parameter built for the group's (a load error is the reasons' business)."""
        return [m for m in self.members() if (m[2] is not None) != _quantized(m[1])
                or (m[2] is not None and self.stored_quantized and m[1] != self.stored)]

    @property
    def built_quantized(self) -> bool:
        """Some member gets parameters of the declared scheme."""
        return any(b is not None for b in self.built)

    @property
    def built_unquantized(self) -> bool:
        return any(b is None for b in self.built)


def _quantized(scheme: str) -> bool:
    return scheme not in UNQUANTIZED and scheme != "other"


def stored_each(g: TensorGroup) -> tuple[tuple[str, str], ...]:
    """(member module, stored scheme) per member in member_modules' order when the group's members are
    stored in different schemes, else ()."""
    if not g.member_schemes:
        return ()
    by_sub = dict(zip((s if isinstance(s, tuple) else (s,) for s in g.subs), g.member_schemes))
    subs = sorted(by_sub)
    return tuple(zip(module_names(g, subs), map(by_sub.__getitem__, subs)))


def member_modules(g: TensorGroup) -> list[str]:
    """Every member's module name, in sub-index order (an exclude entry may name single experts,
    ``...experts.1*``; answers are cached per checkpoint in Facts.excluded_cache)."""
    return module_names(g, sorted(g.sub_indices))


def shown_module(g: TensorGroup) -> str:
    return g.module.replace("{}", str(g.index), 1) if g.index is not None else g.module


def forced_modules(ctx: "EngineContext") -> list[str]:
    """Relative modules the engine's model code builds unquantized at ``ctx.version``."""
    out: list[str] = []
    for entry in ctx.engine.forced_unquantized:
        if (entry.versions is None or in_range(ctx.version, entry.versions)) and holds(entry.when, ctx):
            out.extend(entry.modules)
    return out


def runtime_names(ctx: "EngineContext", name: str, k: int) -> list[str]:
    """``name`` under the engine's prefix renames (exclude lists are matched on these)."""
    return [target + name[len(source):] for source, target in _renames(ctx, k) if name.startswith(source)]


def _renames(ctx: "EngineContext", k: int) -> tuple[tuple[str, str], ...]:
    """The engine's runtime renames as concrete (source, target) prefixes for MTP layer ``k``."""
    key = (ctx.engine.runtime_names, k)
    pairs = ctx.facts.rename_cache.get(key)
    if pairs is None:
        layers = ctx.facts.checkpoint.config.num_hidden_layers
        pairs = ctx.facts.rename_cache[key] = tuple(
            (concrete_prefix(rn.source, layers, k), concrete_prefix(rn.target, layers, k))
            for rn in ctx.engine.runtime_names)
    return pairs


def excluded(ctx: "EngineContext", name: str, k: int, names: str = "either") -> bool:
    """Whether the declared lists leave ``name`` unquantized for this engine.

    ``names``: ``checkpoint`` asks about the stored name, ``runtime`` about the engine's renamed
    module (every rename must be covered; the stored name when no rename applies), ``either``
    accepts both spellings (engine versions differ in which one they match: sgl-project/sglang PR #34906)
    unless the engine rule says it asks the runtime name only (``exclude_names: runtime``).
    """
    names = _engine_names(ctx, names)
    ask = ctx.facts.is_excluded
    ckpt = ask(name)
    if names == "checkpoint" or (names == "either" and ckpt):
        return ckpt
    renamed = [ask(r) for r in runtime_names(ctx, name, k)] if ctx.engine.runtime_names else []
    return all(renamed) if renamed else ckpt


def runtime_only_names(rule: "FamilyRule | None", layers: int, depth: int) -> Callable[[str], tuple[str, ...]]:
    """module -> the names an engine of ``rule`` whose draft asks its lists under runtime names only
    (``exclude_names: runtime``) gives it, for MTP layers 0..depth-1 (none for other engines)."""
    pairs = tuple((concrete_prefix(rn.source, layers, k), concrete_prefix(rn.target, layers, k))
                  for engine in (rule.engines.values() if rule is not None else ())
                  if engine.exclude_names == "runtime" and engine.draft_architecture is not None
                  for rn in engine.runtime_names for k in range(depth))
    if not pairs:
        return lambda name: ()
    return lambda name: tuple(dict.fromkeys(t + name[len(s):] for s, t in pairs if name.startswith(s)))


def _engine_names(ctx: "EngineContext", names: str) -> str:
    """``either`` narrowed to ``runtime`` for an engine rule that asks only its runtime names."""
    return ctx.engine.exclude_names if names == "either" else names


def build_plan(ctx: "EngineContext", names: str = "either", *, exhaustive: bool = False) -> list[ModuleBuild]:
    """Every MTP Linear / head weight group with what ``ctx``'s engine builds for it. Members are asked
    through quant/members.py (one per digit-count signature when no exclude entry can tell
    them apart); ``exhaustive`` asks every member (the reference the shortcut is tested against)."""
    names = _engine_names(ctx, names)
    facts = ctx.facts
    label = facts.checkpoint.declared.label
    forced = forced_modules(ctx) if label is not None else []
    # Contexts of one engine at other versions usually build the same plan: share it per checkpoint, keyed
    # also by the rules/quant entry that answers at this version (its reading may change between releases).
    entry = rule_at(module_quant_rules(ctx.engine.engine), ctx.facts.engine_method, ctx.version)
    key = (names, ctx.draft_quant, tuple(forced), ctx.engine.runtime_names, exhaustive, ctx.engine.engine,
           None if entry is None else (tuple(entry["methods"]), entry.get("versions"), entry["procedure"]))
    cached = facts.plan_cache.get(key)
    if cached is not None:
        return cached
    out: list[ModuleBuild] = []
    # One answer for a whole group unless exclude entries can tell its members apart (they differ in
    # numeric segments only, and forced module names carry none).
    uniform = label is None or ctx.draft_quant == "unquantized"
    for scan in facts.layers.values():
        for g in scan.groups:
            head = is_head_weight(g)
            if not (head or is_linear_weight(g)):
                continue
            shown = shown_module(g)
            rel = scan.relative(shown)
            each = stored_each(g)
            if uniform:
                reason = "undeclared" if label is None else "draft"
                built, reasons = (None,), (reason,)
            else:
                group_reason = "forced" if rel is not None and _is_forced(rel, forced) else "head" if head else None
                if group_reason is not None:
                    built, reasons = (None,), (group_reason,)
                else:
                    # members stored in different schemes: each one is asked, so each is paired with its answer
                    members = member_modules(g) if exhaustive or each else members_to_ask(
                        g, facts.checkpoint.declared.excludes, _renames(ctx, scan.k))
                    answers = [_engine_answer(ctx, g, name, scan.k, names) for name in members]
                    if all(a is not None for a in answers):
                        reasons = tuple({QUANTIZED: "quantized", ERROR: "load_error"}.get(a[0], "excluded")
                                        for a in answers)
                        built = tuple(label if a[0] == QUANTIZED else None for a in answers)
                        causes = tuple(a[1] for a in answers)
                        out.append(ModuleBuild(k=scan.k, module=shown, relative=rel, component=g.component,
                                               stored=g.scheme, built=built, reasons=reasons, causes=causes,
                                               engine_module=answers[0][2], stored_each=each))
                        continue
                    flags = [excluded(ctx, name, scan.k, names) for name in members]
                    reasons = tuple("excluded" if f else "quantized" for f in flags)
                    built = tuple(None if f else label for f in flags)
            out.append(ModuleBuild(k=scan.k, module=shown, relative=rel, component=g.component,
                                   stored=g.scheme, built=built, reasons=reasons, stored_each=each))
    facts.plan_cache[key] = out
    return out


def engine_module(g: TensorGroup, name: str, packed: Mapping[str, list[str]]) -> tuple[str, str]:
    """(module, kind) as the engine asks its quantization config: routed experts as one fused MoE
    (``...experts``), a shard of a fused Linear under the fused name (``q_proj`` -> ``qkv_proj``)."""
    if g.component == "routed_expert":
        cut = name.rfind(".experts")
        if cut >= 0:
            return name[:cut + len(".experts")], "moe"
    head, _, last = name.rpartition(".")
    fused = next((f for f, shards in packed.items() if last in shards), None)
    return (f"{head}.{fused}" if head else fused, "linear") if fused else (name, "linear")


def _engine_answer(ctx: "EngineContext", g: TensorGroup, name: str, k: int,
                   names: str) -> tuple[str, str, str] | None:
    """(built, cause, engine module) from the engine's own decision procedure for the declared method
    (rules/quant/<engine>.yaml); None when the rule file does not model the method at
    this version or cannot evaluate an entry (the generic exclude reading answers then)."""
    section = module_quant_rules(ctx.engine.engine)
    rule = rule_at(section, ctx.facts.engine_method, ctx.version)
    if rule is None:
        return None
    packed = section.get("packed", {})
    spellings = [name] if names == "checkpoint" else \
        ([*runtime_names(ctx, name, k)] or [name]) if names == "runtime" else [name, *runtime_names(ctx, name, k)]
    answers = []
    for spelling in spellings:
        module, kind = engine_module(g, spelling, packed)
        key = (ctx.engine.engine, ctx.version, module, kind)
        hit = ctx.facts.excluded_cache.get(key)
        if hit is None:
            d = decide(section, rule, ctx.facts.checkpoint.declared, module, kind)
            hit = ctx.facts.excluded_cache[key] = (d.built, d.why, module)
        answers.append(hit)
    if any(a[0] == UNKNOWN for a in answers):
        return None
    # Engine versions differ in which spelling they match (sgl-project/sglang PR #34906): an answer that
    # leaves the module unquantized under either spelling wins, as in excluded().
    return next((a for a in answers if a[0] not in (QUANTIZED, ERROR)), answers[0])


def rule_at(section: Mapping[str, Any] | None, method: str | None, version: str) -> Mapping[str, Any] | None:
    """The rules/quant entry for ``method`` whose version range holds ``version`` (a method may have one
    entry per range where the engine changed its reading, e.g. vLLM's ModelOpt keys in 0.33)."""
    if not section or method is None:
        return None
    return next((m for m in section.get("methods", ()) if method in m["methods"]
                 and (not m.get("versions") or in_range(version, m["versions"]))), None)


def _is_forced(rel: str, forced: list[str]) -> bool:
    """``rel`` (a module pattern relative to the layer base) is, or lies under, a forced module."""
    return any(rel == m or rel.startswith(m + ".") for m in forced)


def summary(plan: list[ModuleBuild]) -> tuple[tuple[str, str | None], ...]:
    """(module, built label or None) per group, for EngineVerdict.module_quantization."""
    out = []
    for m in plan:
        built = next((b for b in m.built if b is not None), None)
        out.append((m.module, built))
    return tuple(sorted(out))
