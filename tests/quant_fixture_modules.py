"""The fixtures' MTP modules whose per-engine answer came from rules/quant/<engine>.yaml, as the engine
asks them: shared by the SGLang and vLLM differential tests (tests/test_draft_quant_sglang.py,
tests/test_draft_quant_vllm.py), which each add their engine's own naming of method and config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

from ckptinspect.readiness.draft_build import engine_module
from ckptinspect.readiness.quant_method import engine_method

# The report's reasons that say the engine's own procedure answered for the module.
ANSWERED = ("quantized", "excluded", "load_error")


class Group:
    """The one attribute engine_module reads from a TensorGroup."""

    def __init__(self, component):
        self.component = component


def fixture_module_rows(report, engine: str, packed: dict, has_rule: Callable[[str], bool],
                        runtime_name: Callable[[object, str, object], str] = lambda m, module, r: module,
                        ) -> Iterator[tuple[str, str, dict]]:
    """(fixture name, its engine method, {module as the engine names it: (kind, built)}) for every
    fixture with MTP modules answered by ``engine``'s rule file. ``runtime_name(module_row, name, report)``:
    the engine's own name for a stored module where it differs (e.g. SGLang's NextN decoder)."""
    from fixtures.generate import FIXTURES

    for name, spec in FIXTURES.items():
        if not getattr(spec, "mtp_tensors", 0):
            continue
        r = report(name)
        if r.mtp is None or r.checkpoint.declared.label is None:
            continue
        method = engine_method(r.checkpoint.declared)
        if not has_rule(method):
            continue
        rows = {}
        for m in r.mtp.modules:
            if m.reasons.get(engine) in ANSWERED and m.causes[engine]:
                kind = "moe" if m.component == "routed_expert" else "linear"
                module = runtime_name(m, m.module.replace("{}", "0"), r)
                rows.setdefault(engine_module(Group(m.component), module, packed)[0],
                                (kind, "unquantized" if m.built[engine] == "unquantized" else
                                 "error" if m.built[engine] == "load error" else "quantized"))
        if rows:
            yield name, method, rows


def fixture_quant_config(d: Path) -> dict | None:
    """The quantization config the engines read: config.json's (or its text_config's), else
    hf_quant_config.json (None when there is neither)."""
    hq = d / "hf_quant_config.json"
    cfg = json.loads((d / "config.json").read_text())
    qc = cfg.get("quantization_config") or cfg.get("text_config", {}).get("quantization_config")
    return qc if qc is not None else json.loads(hq.read_text()) if hq.exists() else None
