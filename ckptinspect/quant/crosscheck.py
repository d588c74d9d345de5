"""Declared quantization vs the tensors: where an engine would build the wrong parameter type.

Engines construct each Linear from the *declared* scheme (exclude list says unquantized -> BF16
parameters, otherwise quantized parameters) and then copy the checkpoint tensors in; a mismatch is a
shape / dtype error at load ("Downcasting not allowed", vllm-project/vllm#38650, sgl-project/sglang
PR #34906). Findings are aggregated per module pattern, not per layer.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any, Callable

from ckptinspect.quant.declared import MAX_PATTERN_ENTRIES, UNION_CHUNK, ExcludeMatcher
from ckptinspect.quant.detect import UNQUANTIZED
from ckptinspect.quant.members import weighted_members
from ckptinspect.records import DeclaredQuant, Finding, Inventory
from ckptinspect.safe_regex import RE2_MAX_MEM

# Components that never go through a quantized Linear in either engine.
NOT_LINEAR = frozenset({"embedding", "norm"})
# Engines build routers and LM heads unquantized in their model code for most families, so an
# uncovered BF16 one is informational; some vLLM versions did build Qwen3.5's router as a quantized
# linear (checkpoint_formats §6, item 4), hence still reported.
SOFT_COMPONENTS = frozenset({"router", "lm_head"})


def crosscheck(inventory: Inventory, declared: DeclaredQuant, matcher: ExcludeMatcher,
               engine_names: Callable[[str], tuple[str, ...]] = lambda name: ()) -> list[Finding]:
    """Findings for modules whose actual precision disagrees with the declared lists.

    ``engine_names(module)``: the names an engine asks the lists about instead of the stored one, where
    its draft class asks under its own names only (readiness/draft_build.py ``runtime_only_names``, e.g.
    SGLang's MiMo-V2 draft: ``model.mtp.layers.0.self_attn.o_proj`` is asked as
    ``model.decoder.self_attn.o_proj``): an entry covering that name covers the module, and is no entry
    that matches nothing."""
    if declared.label is None:
        quantized = [g for g in inventory.groups if g.role == "weight" and g.scheme not in UNQUANTIZED
                     and g.scheme != "other"]
        if quantized:
            g = quantized[0]
            return [Finding("undeclared-quantization", "error",
                            f"{len(quantized)} weight groups are {g.scheme} (e.g. {_concrete(g)}) but no "
                            "quantization_config / hf_quant_config.json declares it; engines will load them as BF16",
                            subject=_concrete(g))]
        return []

    not_excluded: dict[str, list[str]] = defaultdict(list)
    wrongly_excluded: dict[str, list[str]] = defaultdict(list)
    representatives: list[str] = []
    components: dict[str, str] = {}
    for g in inventory.groups:
        if g.role != "weight" or g.component in NOT_LINEAR or len(g.shape) < 2:
            representatives.append(_concrete_module(g))
            continue
        # Every member that an exclude entry could tell apart is asked (an entry may name one
        # expert); otherwise one member per digit-count signature answers for the group.
        members = weighted_members(g, declared.excludes)
        representatives.extend(name for name, _ in members)
        key = g.module.replace("{}", "N")
        components[key] = g.component
        for name, stands_for in members:
            excluded = matcher.is_excluded(name)
            aliases = engine_names(name)
            representatives.extend(aliases)
            if excluded is False and any(matcher.is_excluded(a) is True for a in aliases):
                excluded = True
            if g.scheme in UNQUANTIZED and excluded is False:
                not_excluded[key].extend([name] * stands_for)
            elif g.scheme not in UNQUANTIZED and g.scheme != "other" and excluded:
                wrongly_excluded[key].extend([name] * stands_for)

    findings = list(matcher.findings)
    if not declared.excludes:
        # Without any list, engines rely on their model code to keep routers / heads / MTP
        # projections unquantized; say so once instead of per module (checkpoint_formats §6, item 7).
        if not_excluded:
            findings.append(Finding(
                "no-exclude-list", "info",
                f"{declared.label} declares no exclude/ignore list; {len(not_excluded)} unquantized Linear module "
                f"pattern(s) (e.g. {next(iter(sorted(not_excluded)))}) rely on engine model code to stay unquantized",
                reference="vllm-project/vllm#49187, sgl-project/sglang PR #36158"))
        not_excluded = {}
    for key, names in sorted(not_excluded.items()):
        mtp = key.startswith("mtp") or ".mtp" in key
        group_component = components.get(key, "other")
        if group_component == "vision":
            findings.append(_vision_not_excluded(key, names, declared.label))
            continue
        findings.append(Finding(
            "unquantized-not-excluded", "info" if group_component in SOFT_COMPONENTS else "warning",
            f"{key}: {len(names)} module(s) stored unquantized but not covered by the declared exclude/ignore "
            f"lists (e.g. {names[0]}); an engine that trusts the list builds {declared.label} parameters for them",
            subject=names[0], reference="vllm-project/vllm#38650" if mtp else "docs/reference/checkpoint_formats.md §6",
            hint=f"add '{_suggest(key, names[0])}' to the ignore / exclude_modules list"))
    for key, names in sorted(wrongly_excluded.items()):
        findings.append(Finding(
            "quantized-but-excluded", "error",
            f"{key}: {len(names)} module(s) stored quantized but listed as excluded (e.g. {names[0]}); engines "
            "build unquantized parameters and fail to load them",
            subject=names[0], reference="sgl-project/sglang PR #34906"))
    findings.extend(_entries_matching_nothing(declared, matcher, sorted(set(representatives))))
    return findings


def _vision_not_excluded(key: str, names: list[str], label: str | None) -> Finding:
    """A vision-tower module outside the lists is not a load failure by itself: the engines build
    vision towers from their own model code, SGLang's Qwen3-VL / Qwen3.5 towers with no quant config
    at all (SG:models/qwen3_vl.py, SG:models/qwen3_5.py ``quant_config=None``), so the list is never
    asked. Reported as info, naming where it matters."""
    return Finding(
        "vision-not-excluded", "info",
        f"{key}: {len(names)} vision-tower module(s) stored unquantized and not covered by the declared lists "
        f"(e.g. {names[0]}); SGLang's Qwen3-VL / Qwen3.5 vision towers are built without a quant config and "
        f"load them as stored; only an engine whose vision code passes the {label} config on would build "
        "quantized parameters for them",
        subject=names[0], reference="SG:models/qwen3_vl.py (Qwen3VLMoeVisionModel(quant_config=None)); issue 26 item 5",
        hint=f"add '{_suggest(key, names[0])}' to the ignore / exclude_modules list to make it explicit")


def _concrete(g) -> str:  # noqa: ANN001 - TensorGroup
    return next(iter(g.names()))


def _concrete_module(g) -> str:  # noqa: ANN001 - TensorGroup
    if not g.subs:
        sub: tuple = ()
    else:
        first = min(g.subs)
        sub = (first,) if isinstance(first, int) else first
    indices = ((g.index,) if g.index is not None else ()) + tuple(sub)
    return g.module.format(*indices) if indices else g.module


def _suggest(key: str, name: str) -> str:
    """An exclude entry in the exporter's own style: numeric segments as wildcards."""
    if "N" not in key.split("."):
        return name
    return ".".join("*" if part == "N" else part for part in key.split("."))


def _entries_matching_nothing(declared: DeclaredQuant, matcher: ExcludeMatcher,
                              modules: list[str]) -> list[Finding]:
    """Exclude entries naming modules that do not exist (checkpoint_formats §6, pattern 2)."""
    dead: dict[str, list[str]] = defaultdict(list)
    for lst in declared.excludes:
        if lst.semantics not in ("modelopt_glob", "glob"):
            continue
        inner = [e for e in lst.entries if _inner_wildcard(e)][:MAX_PATTERN_ENTRIES]
        inner_hits = _wildcard_hits(inner, modules)
        for entry in lst.entries:
            hit = inner_hits.get(entry, True) if _inner_wildcard(entry) else _entry_hits(entry, modules)
            if not hit:
                dead[lst.source].append(entry)
    out = []
    for source, entries in dead.items():
        out.append(Finding(
            "exclude-entry-matches-nothing", "info",
            f"{source}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} match no quantizable module "
            f"(e.g. {', '.join(entries[:3])})", subject=source))
    return out


def _first_wildcard(entry: str) -> int:
    return min((i for i in (entry.find("*"), entry.find("?"), entry.find("[")) if i >= 0), default=-1)


def _inner_wildcard(entry: str) -> bool:
    star = _first_wildcard(entry)
    return star == 0 or 0 < star < len(entry) - 1


def _wildcard_hits(entries: list[str], modules: list[str]) -> dict[str, bool]:
    """entry -> whether it matches some module (``fnmatchcase(m, e) or fnmatchcase(m, e + ".*")``), for
    entries with a wildcard before their end, in one pass over the modules: RE2 sets of UNION_CHUNK
    entries say which entries match a name, in time linear in the name. (fnmatch per entry and module
    compiled a Python regex per entry: 100,000 entries took minutes.) An entry RE2 cannot evaluate is
    counted as a hit: the matcher already reports it as skipped."""
    from ckptinspect.safe_regex import UnsupportedPattern, translate_glob

    import re2

    hits = dict.fromkeys(entries, False)
    sets: list[tuple[Any, list[str]]] = []
    for start in range(0, len(entries), UNION_CHUNK):
        options = re2.Options()
        options.log_errors = False
        options.max_mem = RE2_MAX_MEM
        rset, names = re2.Set.MatchSet(options), []
        for entry in entries[start:start + UNION_CHUNK]:
            try:
                rset.Add(f"(?:{translate_glob(entry)})(?s:\\..*)?\\z")
                names.append(entry)
            except (UnsupportedPattern, re2.error):
                hits[entry] = True
        if names and rset.Compile():
            sets.append((rset, names))
        else:
            hits.update(dict.fromkeys(names, True))
    left = sum(1 for v in hits.values() if not v)
    for module in modules:
        if not left:
            break
        for rset, names in sets:
            for i in rset.Match(module) or ():
                if not hits[names[i]]:
                    hits[names[i]] = True
                    left -= 1
    return hits


def _entry_hits(entry: str, modules: list[str]) -> bool:
    star = _first_wildcard(entry)
    literal = entry if star < 0 else entry[:star]
    # Plain name or a trailing wildcard: a sorted-prefix lookup instead of a scan.
    i = bisect.bisect_left(modules, literal)
    while i < len(modules) and modules[i].startswith(literal):
        m = modules[i]
        if star >= 0 or m == entry or m.startswith(entry + "."):
            return True
        i += 1
    return False
