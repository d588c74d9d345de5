"""Rule conditions about how the MTP layer is quantized relative to the declaration and the trunk.

Registered as kind ``family`` in the one condition registry (ckptinspect/rules/conditions.py) by
readiness/conditions.py; each takes (EngineContext, argument) and puts what it found into
``ctx.details`` for the message. All work on inventory groups (a few
hundred), never per tensor.
"""

from __future__ import annotations

import fnmatch
import re
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ckptinspect.readiness.context import listed_sample
from ckptinspect.readiness.draft_build import UNQUANTIZED, build_plan, is_linear_weight, member_modules

if TYPE_CHECKING:
    from ckptinspect.readiness.context import EngineContext


def _quantized(scheme: str) -> bool:
    return scheme not in UNQUANTIZED and scheme != "other"


def _components(arg: Any) -> set[str] | None:
    if isinstance(arg, Mapping) and arg.get("components"):
        return set(arg["components"])
    return None


def _scheme_differs_from_trunk(ctx: "EngineContext", arg: Any) -> bool:
    """MTP modules the engine builds with the declared (global) scheme whose stored scheme is none
    of the schemes the trunk stores for the same component: one global algorithm cannot describe
    both (vllm-project/vllm#43455: NVFP4 trunk, MXFP4 MTP experts)."""
    wanted = _components(arg)
    trunk: dict[str, set[str]] = {}
    for g in ctx.facts.checkpoint.inventory.groups:
        if g.mtp_layer is None and is_linear_weight(g) and _quantized(g.scheme):
            trunk.setdefault(g.component, set()).add(g.scheme)
    hits = []
    for m in build_plan(ctx):
        if wanted is not None and m.component not in wanted:
            continue
        if m.built_quantized and _quantized(m.stored) and trunk.get(m.component) \
                and m.stored not in trunk[m.component]:
            hits.append(f"{m.module} ({m.stored}; trunk {'/'.join(sorted(trunk[m.component]))})")
    if hits:
        ctx.details["scheme_mismatch"] = listed_sample(hits, 4)
    return bool(hits) if arg is not False else not hits


def _layer_algos(ctx: "EngineContext", components: set[str] | None) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """ModelOpt MIXED_PRECISION ``quantized_layers`` algorithms: (MTP module -> algos, trunk component -> algos).
    Every member is looked up (exact name or a listed parent by dict lookup; glob keys, rare, by fnmatch)."""
    listed = ctx.facts.checkpoint.declared.quantized_layers
    if not listed:
        return {}, {}
    globs = [k for k in listed if any(c in k for c in "*?[")]
    mtp: dict[str, set[str]] = {}
    trunk: dict[str, set[str]] = {}
    for g in ctx.facts.checkpoint.inventory.groups:
        if not is_linear_weight(g) or (components is not None and g.component not in components):
            continue
        algos = {a for name in member_modules(g) for a in _algos_of(name, listed, globs)}
        if not algos:
            continue
        if g.mtp_layer is not None:
            mtp.setdefault(g.module.replace("{}", str(g.index), 1) if g.index is not None else g.module,
                           set()).update(algos)
        else:
            trunk.setdefault(g.component, set()).update(algos)
    return mtp, trunk


def _algos_of(module: str, listed: Mapping[str, str], globs: list[str]) -> set[str]:
    """Algorithms of the quantized_layers entries naming ``module`` (itself, a parent, or a glob)."""
    out = set()
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        hit = listed.get(".".join(parts[:end]))
        if hit is not None:
            out.add(hit)
    out.update(listed[k] for k in globs if fnmatch.fnmatchcase(module, k))
    return out


def _layer_algo_is(ctx: "EngineContext", arg: Any) -> bool:
    """An MTP module's quantized_layers algorithm is one of ``algos``."""
    algos = set(arg.get("algos", ())) if isinstance(arg, Mapping) else set(arg)
    mtp, _ = _layer_algos(ctx, _components(arg))
    hits = sorted(f"{m}: {a}" for m, found in mtp.items() for a in found if a in algos)
    if hits:
        ctx.details["mtp_layer_algos"] = listed_sample(hits, 4)
    return bool(hits)


def _layer_algo_differs(ctx: "EngineContext", arg: Any) -> bool:
    """quantized_layers gives MTP modules another algorithm than the trunk's modules of the same component."""
    components = _components(arg)
    mtp, trunk = _layer_algos(ctx, components)
    groups = {g.module.replace("{}", str(g.index), 1) if g.index is not None else g.module: g.component
              for g in ctx.facts.mtp_groups()}
    hits = []
    for module, algos in sorted(mtp.items()):
        theirs = trunk.get(groups.get(module, ""), set())
        if theirs and algos - theirs:
            hits.append(f"{module}: {'/'.join(sorted(algos))} (trunk {'/'.join(sorted(theirs))})")
    if hits:
        ctx.details["mtp_layer_algos"] = listed_sample(hits, 4)
    return bool(hits) if arg is not False else not hits


def _layer_index_in(ctx: "EngineContext", arg: Any) -> bool:
    """The numeric index in the base of MTP layer 0 (``model.layers.61.`` -> 61) is one of ``arg``."""
    scan = ctx.facts.layers.get(0) or next(iter(ctx.facts.layers.values()), None)
    if scan is None:
        return False
    numbers = re.findall(r"(?:^|\.)(\d+)(?=\.)", scan.base)
    if numbers:
        ctx.details["mtp_index"] = int(numbers[0])
    return bool(numbers) and int(numbers[0]) in set(arg)


def _companions_missing(ctx: "EngineContext", arg: Any) -> bool:
    """MTP weight groups of ``schemes`` that the engine builds quantized but whose module lacks every
    companion of one of the role alternatives (``roles``: list of roles, any one suffices)."""
    schemes = set(arg.get("schemes", ()))
    roles = set(arg.get("roles", ()))
    built = {m.module for m in build_plan(ctx) if m.built_quantized}
    companions: dict[tuple[str, int | None], set[str]] = {}
    for g in ctx.facts.mtp_groups():
        companions.setdefault((g.module, g.index), set()).add(g.role)
    hits = []
    for g in ctx.facts.mtp_groups():
        if g.role not in ("weight", "other") or g.scheme not in schemes:
            continue
        shown = g.module.replace("{}", str(g.index), 1) if g.index is not None else g.module
        if shown in built and not (companions.get((g.module, g.index), set()) & roles):
            hits.append(shown)
    if hits:
        ctx.details["missing_companions"] = listed_sample(sorted(hits))
        ctx.details["companion_roles"] = " / ".join(sorted(roles))
    return bool(hits)


def _declared_activation_quant(ctx: "EngineContext", arg: Any) -> bool:
    """The declaration quantizes activations too (W4A4 / W8A8), as opposed to weight-only schemes:
    compressed-tensors ``input_activations`` null in every config group, ModelOpt ``W4A16_*`` algorithms."""
    declared = ctx.facts.checkpoint.declared
    raw = declared.raw if isinstance(declared.raw, Mapping) else {}
    groups = raw.get("config_groups") if isinstance(raw.get("config_groups"), Mapping) else None
    if groups:
        quantizes = any(isinstance(g, Mapping) and g.get("input_activations") for g in groups.values())
    else:
        quantizes = declared.label is not None and "W4A16" not in (declared.algo or "").upper()
    return quantizes == bool(arg)


def _engine_load_error(ctx: "EngineContext", arg: Any) -> bool:
    """The engine's quantization config raises for an MTP module it builds (fused shards the lists
    split, a compressed-tensors module in no target): rules/quant/<engine>.yaml."""
    hits = []
    for m in build_plan(ctx):
        for reason, cause in zip(m.reasons, m.causes):
            if reason == "load_error":
                hits.append(f"{m.engine_module or m.module}: {cause}")
                break
    hits = sorted(set(hits))
    if hits:
        ctx.details["load_errors"] = listed_sample(hits, 3)
    return bool(hits) if arg is not False else not hits


def _declared_keys(ctx: "EngineContext", arg: Any) -> bool:
    """The declared quantization dict sets every listed key: ``true`` = to anything non-null, a list = to
    one of those strings (case-insensitive, as SGLang upper-cases quant_algo / moe_quant_algo). SGLang's
    hybrid FP8 + NVFP4 detection is such a test (SG:configs/model_config.py nvfp4_moe_meta)."""
    raw = ctx.facts.checkpoint.declared.raw if isinstance(ctx.facts.checkpoint.declared.raw, Mapping) else {}
    for key, want in arg.items():
        value = raw.get(key)
        if value is None:
            return False
        if want is not True and str(value).upper() not in {str(w).upper() for w in want}:
            return False
    return True


def _declared_list_misses(ctx: "EngineContext", arg: Any) -> bool:
    """Some name (``{k}`` = each present MTP layer index) matches no pattern of the declared dict's list
    ``key`` by fnmatchcase (a missing list matches nothing): how an engine that matches a ModelOpt
    ``ignore`` list by fnmatch decides per MTP layer (the family rule using it cites the engine function)."""

    raw = ctx.facts.checkpoint.declared.raw if isinstance(ctx.facts.checkpoint.declared.raw, Mapping) else {}
    listed = raw.get(arg["key"])
    patterns = [p for p in listed if isinstance(p, str)] if isinstance(listed, list) else []
    missed = [name.replace("{k}", str(k)) for k in sorted(ctx.facts.layers) for name in arg["names"]
              if not any(fnmatch.fnmatchcase(name.replace("{k}", str(k)), p) for p in patterns)]
    if missed:
        ctx.details["unlisted_names"] = ", ".join(missed)
        ctx.details["list_key"] = arg["key"]
    return bool(missed)


# The scheme family a declared label builds, for ``schemes: true`` below (None: not decided from the label).
_LABEL_SCHEMES = (("mxfp4", {"mxfp4"}), ("nvfp4", {"nvfp4"}), ("fp4", {"nvfp4"}), ("fp8", {"fp8_block", "fp8_channel", "fp8_tensor"}),
                  ("int8", {"int8"}), ("w8a8", {"int8"}), ("awq", {"int4_awq"}), ("gptq", {"int4_gptq"}),
                  ("int4", {"int4_pack", "int4_awq", "int4_gptq"}))


def label_schemes(label: str) -> set[str] | None:
    low = label.lower()
    return next((schemes for key, schemes in _LABEL_SCHEMES if key in low), None)


def _built_unlike_stored(ctx: "EngineContext", arg: Any) -> bool:
    """Per MTP module of the report's module table: the engine builds it quantized while it is stored
    unquantized or the reverse, or its quantization config refuses it; ``schemes: true`` also counts a
    quantized module built from a label whose scheme family is not the stored one (an MXFP4 module
    under a global NVFP4 / FP8 label). What a family defect that claims "the tensors do not fit" must
    rest on: a stored fact alone never says what the engine builds.

    Members count one by one where a group's members are stored in different schemes or code dtypes (one
    routed expert stored BF16 among block-FP8 ones: the engine builds the group's one fused parameter from
    the declared scheme and copies each expert's tensor into its slot); ``members: true`` counts only those
    modules."""
    spec = arg if isinstance(arg, Mapping) else {}
    wanted = _components(spec)
    hits = []
    for m in build_plan(ctx):
        if wanted is not None and m.component not in wanted:
            continue
        if spec.get("members") and not m.stored_each:
            continue
        unlike = m.unlike_stored()
        if m.stored_each and unlike:
            shown = ", ".join(f"{name} stored {stored}" for name, stored, _ in unlike[:2])
            more = f" and {len(unlike) - 2} more" if len(unlike) > 2 else ""
            built = "/".join(sorted({b or "unquantized" for _, _, b in unlike}))
            hits.append(f"{m.module}: {len(unlike)} of {len(m.stored_each)} members unlike the parameter built for "
                        f"them ({shown}{more}; built {built})")
            continue
        if spec.get("members"):
            continue
        if "load_error" in m.reasons or unlike:
            hits.append(f"{m.module} (stored {m.stored}, built {'/'.join(sorted({b or 'unquantized' for b in m.built}))})")
            continue
        if spec.get("schemes") and m.stored_quantized:
            built = {b for b in m.built if b is not None}
            families = [label_schemes(b) for b in built]
            if any(f is not None and m.stored not in f for f in families):
                hits.append(f"{m.module} (stored {m.stored}, built {'/'.join(sorted(built))})")
    if hits:
        ctx.details["built_unlike_stored"] = listed_sample(hits, 3)
    return bool(hits) if arg is not False else not hits


def _declared_list_covers(ctx: "EngineContext", arg: Any) -> bool:
    """Every name matches some pattern of the list (the negation of declared_list_misses, as a per-module
    fact a defect can name)."""
    return not _declared_list_misses(ctx, arg)


def _declared_sources(ctx: "EngineContext", arg: Any) -> bool:
    """The checkpoint declares its quantization, and only in the listed files (``hf_quant_config.json``:
    no ``quantization_config`` in config.json). Engines that read the declaration from the model config
    object find nothing there then (the family rule using it cites the engine code)."""
    sources = ctx.facts.checkpoint.declared.sources
    return bool(sources) and all(source.split(":", 1)[0] in set(arg) for source in sources)


QUANT_CONDITIONS: dict[str, Callable[["EngineContext", Any], bool]] = {
    "declared_sources": _declared_sources,
    "mtp_module_built_unlike_stored": _built_unlike_stored,
    "declared_list_covers": _declared_list_covers,
    "declared_keys": _declared_keys,
    "declared_list_misses": _declared_list_misses,
    "mtp_engine_load_error": _engine_load_error,
    "mtp_scheme_differs_from_trunk": _scheme_differs_from_trunk,
    "mtp_layer_algo_is": _layer_algo_is,
    "mtp_layer_algo_differs_from_trunk": _layer_algo_differs,
    "mtp_layer_index_in": _layer_index_in,
    "mtp_companions_missing": _companions_missing,
    "declared_activation_quant": _declared_activation_quant,
}
