"""Declared quantization: read the config files and match exclude / ignore lists the way the
exporters (and the engines that honour them) do.

Where it lives (checkpoint_formats §4.1): ``config.json`` ``quantization_config`` (also under
``text_config`` for multimodal wrappers, or ``compression_config`` in older compressed-tensors
exports) and/or ModelOpt's ``hf_quant_config.json`` ``quantization``. When both exist, config.json is
preferred (SGLang's detection order, python/sglang/srt/configs/model_config.py
``_parse_quant_hf_config``) and the two exclude lists are compared.

List semantics (checkpoint_formats §6):
- ModelOpt ``exclude_modules`` / ``ignore``: fnmatch wildcards; exporters summarise runs as prefix
  wildcards (``model.layers.61*``), so ``mtp.layers.0*`` does not cover ``mtp.fc``.
- compressed-tensors ``ignore``: ``re:`` prefix = ``re.match`` (anchored at the start, not a full match),
  otherwise exact equality (vllm-project/compressed-tensors utils/match.py ``match_name``).
- ``modules_to_not_convert`` (HF fp8 / mxfp4): plain names or globs, a listed parent covers children.
- ModelOpt MIXED_PRECISION ``quantized_layers``: an inclusion map; unlisted modules are unquantized.
- GPTQ ``dynamic``: ``-:<regex>`` keys exclude modules.
"""

from __future__ import annotations

from typing import Any, Mapping

from ckptinspect.errors import ConfigError
from ckptinspect.records import DeclaredQuant, ExcludeList, Finding
from ckptinspect.safe_regex import UnsupportedPattern, compile_re2, translate, translate_glob


def read_declared(config: Mapping[str, Any], hf_quant: Any,
                  modelslim: Any = None) -> tuple[DeclaredQuant, list[Finding]]:
    """Parse the declared quantization from config.json and hf_quant_config.json, or from ModelSlim's
    quant_model_description.json when the checkpoint has one: SGLang then reads that file instead of
    config.json's quantization_config (SG:configs/model_config.py _find_quant_modelslim_config,
    ``modelslim_config or hf_config``) and the per-module decision is its type map's."""
    if modelslim is not None:
        if not isinstance(modelslim, dict):
            raise ConfigError("is not a JSON object", path="quant_model_description.json")
        return DeclaredQuant("modelslim", "modelslim", None, None, None, None, None,
                             ("quant_model_description.json",), (), raw=modelslim), []
    findings: list[Finding] = []
    qc, qc_source = None, None
    for path in ("quantization_config", "text_config.quantization_config", "compression_config"):
        node = _dig(config, path)
        if node is not None:
            if not isinstance(node, dict):
                raise ConfigError(f"'{path}' must be an object", path="config.json")
            qc, qc_source = node, f"config.json:{path}"
            break
    hq = None
    if hf_quant is not None:
        if not isinstance(hf_quant, dict):
            raise ConfigError("is not a JSON object", path="hf_quant_config.json")
        hq = hf_quant.get("quantization", hf_quant)
        if not isinstance(hq, dict):
            raise ConfigError("'quantization' must be an object", path="hf_quant_config.json")

    if qc is None and hq is None:
        return DeclaredQuant(None, None, None, None, None, None, None, (), ()), findings

    sources, excludes = [], []
    method = algo = kv = scale_fmt = None
    group_size = None
    block: tuple[int, ...] | None = None
    quantized_layers: dict[str, str] = {}
    if qc is not None:
        sources.append(qc_source)
        method = _str(qc.get("quant_method"), "quant_method")
        algo = _str(qc.get("quant_algo"), "quant_algo")
        scale_fmt = _str(qc.get("scale_fmt"), "scale_fmt")
        if isinstance(qc.get("weight_block_size"), list):
            block = tuple(int(x) for x in qc["weight_block_size"])
        group_size = _group_size(qc)
        kv = _kv_scheme(qc.get("kv_cache_scheme"))
        excludes.extend(_lists_from_qc(qc, qc_source, method))
        hybrid = (str(qc.get("quant_algo", "")).upper() == "MIXED_PRECISION"
                  and str(qc.get("moe_quant_algo", "")).upper() == "NVFP4" and qc.get("group_size") is not None)
        if method == "fp8" and isinstance(qc.get("ignore"), list) and qc["ignore"] and hybrid:
            # nvidia's DeepSeek-V4 NVFP4 exports: the list names FP8 Linears (built FP8, as stored) and the
            # MXFP4 MTP experts, which both engines keep MXFP4 because their hybrid paths read it for MoEs.
            findings.append(Finding(
                "fp8-ignore-read-for-experts-only", "info",
                f"{qc_source}.ignore lists {len(qc['ignore'])} entries. FP8 configs do not read it for Linears "
                "(only ignored_layers / modules_to_not_convert): SGLang and vLLM build the Linears it names FP8. "
                "For this hybrid FP8 + NVFP4 layout (quant_algo MIXED_PRECISION, moe_quant_algo NVFP4) both read "
                "it for the routed experts: expert layers it names keep their source MXFP4 format, the others are "
                "built NVFP4",
                subject=f"{qc_source}.ignore",
                reference="SG:model_loader/loader.py:222-250 (HybridFp8NvFp4Config: NVFP4 excludes = ignore + "
                          "model.decoder.* + stages.*); VL:models/deepseek_v41/quant_config.py:111-124, 195-219 "
                          "(v0.33.0 on CUDA / ROCm: _modelopt_ignore, _is_nvfp4_expert_layer)",
                hint="a Linear it names that ships unquantized needs modules_to_not_convert as well"))
        elif method == "fp8" and isinstance(qc.get("ignore"), list) and qc["ignore"]:
            findings.append(Finding(
                "fp8-ignore-not-read", "warning",
                f"{qc_source}.ignore lists {len(qc['ignore'])} module(s), but FP8 configs read only "
                "ignored_layers / modules_to_not_convert: SGLang and vLLM build those modules FP8",
                subject=f"{qc_source}.ignore",
                reference="SG:layers/quantization/fp8.py Fp8Config.from_config; "
                          "vllm-project/vllm vllm/model_executor/layers/quantization/fp8.py Fp8Config.from_config",
                hint="rename the key to modules_to_not_convert if those modules ship unquantized"))
        quantized_layers.update(_quantized_layers(qc))
    if hq is not None:
        sources.append("hf_quant_config.json:quantization")
        algo = algo or _str(hq.get("quant_algo"), "quant_algo")
        kv = kv or _str(hq.get("kv_cache_quant_algo"), "kv_cache_quant_algo")
        group_size = group_size or (hq.get("group_size") if isinstance(hq.get("group_size"), int) else None)
        method = method or "modelopt"
        if isinstance(hq.get("exclude_modules"), list):
            excludes.append(ExcludeList("hf_quant_config.json:quantization.exclude_modules", "modelopt_glob",
                                        tuple(str(x) for x in hq["exclude_modules"])))
        quantized_layers.update(_quantized_layers(hq))
    if method is None and algo is not None:
        method = "modelopt"
    if quantized_layers:
        excludes.append(ExcludeList("quantized_layers", "include_map", tuple(quantized_layers)))

    label = method if not algo or method != "modelopt" else f"modelopt:{algo}"
    findings.extend(_compare_lists(excludes))
    return DeclaredQuant(
        label=label, method=method, algo=algo, group_size=group_size, block_size=block, scale_fmt=scale_fmt,
        kv_cache=kv, sources=tuple(sources), excludes=tuple(excludes), quantized_layers=quantized_layers,
        raw=qc if qc is not None else hq, producer=_producer(qc if qc is not None else hf_quant),
    ), findings


def _producer(node: Any) -> str | None:
    producer = node.get("producer") if isinstance(node, Mapping) else None
    name = producer.get("name") if isinstance(producer, Mapping) else None
    return name if isinstance(name, str) else None


def _dig(node: Mapping[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _str(value: Any, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"quantization '{key}' must be a string, got {value!r}", path="config.json")
    return value


def _group_size(qc: Mapping[str, Any]) -> int | None:
    if isinstance(qc.get("group_size"), int):
        return qc["group_size"]
    for group in (qc.get("config_groups") or {}).values():
        weights = group.get("weights") if isinstance(group, dict) else None
        if isinstance(weights, dict) and isinstance(weights.get("group_size"), int):
            return weights["group_size"]
    return None


def _kv_scheme(value: Any) -> str | None:
    if isinstance(value, str):
        return value  # some per-tensor FP8 ModelOpt exports write a bare "FP8"
    if isinstance(value, dict) and value.get("num_bits"):
        return f"{value.get('type', 'int')}{value['num_bits']}"
    return None


def _lists_from_qc(qc: Mapping[str, Any], source: str, method: str | None) -> list[ExcludeList]:
    out = []
    # FP8 configs read ignored_layers / modules_to_not_convert only (SG:layers/quantization/fp8.py
    # Fp8Config.from_config; vLLM's Fp8Config.from_config likewise): an `ignore` list there excludes
    # nothing (read_declared reports it as fp8-ignore-not-read).
    if isinstance(qc.get("ignore"), list) and method != "fp8":
        semantics = "ct_regex" if method == "compressed-tensors" else "modelopt_glob"
        out.append(ExcludeList(f"{source}.ignore", semantics, tuple(str(x) for x in qc["ignore"])))
    if isinstance(qc.get("exclude"), list):  # Quark: names or re: regexes (quark/utils.py should_ignore_layer)
        out.append(ExcludeList(f"{source}.exclude", "ct_regex", tuple(str(x) for x in qc["exclude"])))
    for key in ("modules_to_not_convert", "ignored_layers", "exclude_modules"):
        if isinstance(qc.get(key), list):
            semantics = "modelopt_glob" if key == "exclude_modules" else "glob"
            out.append(ExcludeList(f"{source}.{key}", semantics, tuple(str(x) for x in qc[key])))
    dynamic = qc.get("dynamic")
    if isinstance(dynamic, dict):
        negatives = tuple(k[2:] for k in dynamic if isinstance(k, str) and k.startswith("-:"))
        if negatives:
            out.append(ExcludeList(f"{source}.dynamic", "gptq_dynamic", negatives))
    return out


def _quantized_layers(node: Mapping[str, Any]) -> dict[str, str]:
    layers = node.get("quantized_layers")
    if not isinstance(layers, dict):
        return {}
    return {str(k): str(v.get("quant_algo", "")) if isinstance(v, dict) else str(v) for k, v in layers.items()}


def _compare_lists(excludes: list[ExcludeList]) -> list[Finding]:
    modelopt = [e for e in excludes if e.semantics == "modelopt_glob"]
    if len(modelopt) < 2:
        return []
    a, b = modelopt[0], modelopt[1]
    only_a, only_b = set(a.entries) - set(b.entries), set(b.entries) - set(a.entries)
    if not only_a and not only_b:
        return []
    sample = ", ".join(sorted(only_a | only_b)[:4])
    return [Finding("exclude-lists-disagree", "warning",
                    f"{a.source} and {b.source} differ ({len(only_a)} entries only in the first, "
                    f"{len(only_b)} only in the second, e.g. {sample}); engines read different files",
                    reference="docs/reference/checkpoint_formats.md §6 (lists drift between exporter versions)")]


# Wildcard / regex entries evaluated per exclude list (real lists: 184 ModelOpt entries, a few hundred
# compressed-tensors ones; plain names are unlimited, they are a set lookup), and RE2 parts per program.
MAX_PATTERN_ENTRIES = 10_000
UNION_CHUNK = 256


class ExcludeMatcher:
    """Compiled exclude lists of a DeclaredQuant; ``is_excluded(module_name)`` is the question.

    The entries come from the checkpoint, so every pattern (compressed-tensors ``re:``, GPTQ dynamic,
    ModelOpt / HF globs) runs on RE2 in linear time, with Python ``re.match`` / ``fnmatch`` answers
    (ckptinspect/safe_regex.py); an entry RE2 cannot evaluate is skipped with an
    ``exclude-entry-skipped`` finding instead of being guessed at.
    """

    def __init__(self, declared: DeclaredQuant) -> None:
        self.declared = declared
        self.findings: list[Finding] = []
        self._regexes: list[tuple[ExcludeList, Any, Any, frozenset[str]]] = []
        for lst in declared.excludes:
            self._regexes.append(self._compile(lst))

    def _compile(self, lst: ExcludeList) -> tuple[ExcludeList, Any, Any, frozenset[str]]:
        parts: list[tuple[int, str, str]] = []  # (position, entry, its RE2 part)
        refused: list[tuple[int, str, str]] = []  # (position, entry, why): findings in entry order
        exact = []
        literals = []  # glob entries without a wildcard: the name or a parent, one set lookup per prefix
        over = 0
        for position, entry in enumerate(lst.entries):
            try:
                if lst.semantics in ("ct_regex", "gptq_dynamic") and (entry.startswith("re:")
                                                                      or lst.semantics == "gptq_dynamic"):
                    if len(parts) >= MAX_PATTERN_ENTRIES:
                        over += 1
                        continue
                    body = entry[3:] if entry.startswith("re:") else entry
                    part = f"(?:{translate(body)})"  # re.match semantics: anchored at the start only
                elif lst.semantics in ("modelopt_glob", "glob"):
                    if not any(c in entry for c in "*?["):
                        literals.append(entry)  # fnmatch of a plain name is equality
                        continue
                    if len(parts) >= MAX_PATTERN_ENTRIES:
                        over += 1
                        continue
                    # A listed parent covers its children in both vLLM and HF loaders.
                    part = f"(?:{translate_glob(entry)})(?s:\\..*)?\\z"
                elif lst.semantics == "include_map":  # the name or a parent listed, or a glob key
                    exact.append(entry)
                    part = f"(?:{translate_glob(entry)})\\z"
                else:
                    exact.append(entry)
                    continue
            except UnsupportedPattern as exc:
                refused.append((position, entry, str(exc)))
                continue
            parts.append((position, entry, part))
        if over:
            # Never guessed: an entry not evaluated may exclude the MTP layer, so the verdicts that read
            # this list cannot be trusted (an error, like any check that cannot run).
            self.findings.append(Finding(
                "exclude-list-too-long", "error",
                f"{lst.source}: {over:,} wildcard / regex entries beyond the first {MAX_PATTERN_ENTRIES:,} "
                "were not evaluated; what the engines build for the modules they name is unknown",
                subject=lst.source))
        # RE2 programs of at most UNION_CHUNK parts each: one union of 100,000 parts overflows RE2's
        # memory cap and its simplifier (which then logs to stderr itself), and the entry-by-entry
        # fallback after that costs a compilation per entry; chunks keep both linear and quiet.
        programs = [p for start in range(0, len(parts), UNION_CHUNK)
                    if (p := self._compile_union(lst, parts[start:start + UNION_CHUNK], refused)) is not None]
        regex = _Programs(programs) if programs else None
        for _, entry, why in sorted(refused):
            self._unsafe(lst, entry, why)
        return (lst, regex, frozenset(exact) if lst.semantics == "include_map" else tuple(exact),
                frozenset(literals))

    def _compile_union(self, lst: ExcludeList, parts: list[tuple[int, str, str]],
                       refused: list[tuple[int, str, str]]) -> Any:
        try:
            # One compilation of the chunk's union. Each part is a whole regex on its own (translate()
            # has Python's parser accept it, globs are escaped by translate_glob), so no part can close
            # another's group, and RE2 compiles a union only when it compiles every part: success here
            # means every entry is evaluated, as compiling each alone would have shown.
            return compile_re2("|".join(part for _, _, part in parts))
        except UnsupportedPattern:
            return self._compile_entrywise(lst, parts, refused)

    def _compile_entrywise(self, lst: ExcludeList, parts: list[tuple[int, str, str]],
                           refused: list[tuple[int, str, str]]) -> Any:
        """The union of the parts RE2 accepts alone; each refused one is added to ``refused``."""
        kept = []
        for position, entry, part in parts:
            try:
                compile_re2(part)
            except UnsupportedPattern as exc:
                refused.append((position, entry, str(exc)))
                continue
            kept.append(part)
        if not kept:
            return None
        try:
            return compile_re2("|".join(kept))
        except UnsupportedPattern as exc:  # the entries fit RE2's memory cap alone, not together
            refused.append((len(lst.entries), f"{len(kept)} entries", str(exc)))
            return None

    def _unsafe(self, lst: ExcludeList, entry: str, why: str) -> None:
        self.findings.append(Finding("exclude-entry-skipped", "warning",
                                     f"{lst.source}: entry {entry[:80]!r} not evaluated: {why}"))

    def is_excluded(self, module: str) -> bool | None:
        """True when the declared lists leave ``module`` unquantized, False when they quantize it,
        None when the checkpoint declares no quantization."""
        if self.declared.label is None:
            return None
        for lst, regex, exact, literals in self._regexes:
            if lst.semantics == "include_map":
                if not (_listed(module, exact) or (regex is not None and regex.match(module))):
                    return True
                continue
            if module in exact or (literals and _listed(module, literals)):
                return True
            if regex is not None and regex.match(module):
                return True
        return False


class _Programs:
    """Several RE2 programs asked as one: a match of any (each is linear in the name)."""

    def __init__(self, programs: list[Any]) -> None:
        self.programs = programs

    def match(self, text: str) -> bool:
        return any(p.match(text) is not None for p in self.programs)


def _listed(module: str, names: frozenset[str]) -> bool:
    """``module`` or one of its parents is in ``names`` (one set lookup per dotted prefix)."""
    if module in names:
        return True
    dot = module.find(".")
    while dot >= 0:
        if module[:dot] in names:
            return True
        dot = module.find(".", dot + 1)
    return False


_MATCHERS: dict[tuple, ExcludeMatcher] = {}


def matcher_for(declared: DeclaredQuant) -> ExcludeMatcher:
    """The compiled matcher of a DeclaredQuant, compiled once per distinct set of lists
    (a 184-entry ModelOpt list costs ~50 ms of regex compilation)."""
    key = (declared.label, tuple((e.source, e.semantics, e.entries) for e in declared.excludes))
    matcher = _MATCHERS.get(key)
    if matcher is None:
        matcher = _MATCHERS[key] = ExcludeMatcher(declared)
    return matcher


def is_excluded(declared: DeclaredQuant, module: str) -> bool | None:
    """True when the declared lists leave ``module`` unquantized (see ExcludeMatcher.is_excluded)."""
    return matcher_for(declared).is_excluded(module)
