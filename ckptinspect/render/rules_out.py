"""`rules` output: the family listing (text table or JSON), one resolved family (YAML or JSON), and the
one line per file of `rules validate`."""

from __future__ import annotations

import json
from typing import Any, Sequence

LIST_FORMATS = ("text", "json")
SHOW_FORMATS = ("yaml", "json")


def _origin(fam: Any) -> str:
    return "built-in" if fam.origin == 0 else fam.source


def family_row(fam: Any) -> dict[str, Any]:
    """What `rules list --format json` says about one family (readiness.FamilyRule)."""
    mtp = fam.mtp
    return {
        "id": fam.id, "name": fam.name, "abstract": fam.abstract,
        "architectures": list(fam.architectures), "model_types": list(fam.model_types),
        "config_keys_any": list(fam.config_keys),
        "mtp": mtp.supported, "prefixes": list(fam.mtp_prefixes), "depth_keys": list(mtp.depth_keys),
        "sglang": fam.engines["sglang"].draft_architecture if "sglang" in fam.engines else None,
        "vllm": fam.engines["vllm"].draft_architecture if "vllm" in fam.engines else None,
        "source": _origin(fam),
    }


def render_rules_list(families: Sequence[Any], fmt: str) -> str:
    """The families as a JSON document or a table, one line per family at any width (like `pip list`:
    it is what people grep)."""
    rows = [family_row(fam) for fam in families]
    if fmt == "json":
        return json.dumps({"families": rows}, indent=2)
    from ckptinspect.escape import escaped

    rows = escaped(rows)  # ids, names and paths of user rule files
    from tabulate import tabulate

    def archs(names: list[str]) -> str:
        return "-" if not names else names[0] + (f" (+{len(names) - 1})" if len(names) > 1 else "")

    # Every model_type is listed (not abbreviated like architectures): it is what users grep
    # config.json for, and a family matched only by text_config.model_type must be findable here.
    table = [[r["id"], archs(r["architectures"]), ", ".join(r["model_types"]) or "-",
              r["prefixes"][0] if r["prefixes"] else "-", r["depth_keys"][0] if r["depth_keys"] else "-",
              r["sglang"] or "-", r["vllm"] or "-", r["source"]] for r in rows]
    return tabulate(table, headers=["family", "architectures", "model types", "MTP prefix", "depth key",
                                    "SGLang draft", "vLLM draft", "source"])


def render_family_rule(fam: Any, fmt: str) -> str:
    """One family with everything it inherits (``extends``) merged, as YAML (with a comment naming its
    file) or JSON."""
    doc = {k: v for k, v in fam.document.items() if k != "extends"}
    doc["id"], doc["name"] = fam.id, fam.name
    if fmt == "json":
        return json.dumps({"source": fam.source, "extends": fam.extends, "rule": doc}, indent=2)
    import yaml

    from ckptinspect.escape import escape_controls, escaped

    doc = escaped(doc)
    head = escape_controls(f"# {fam.id}: {fam.source}")
    if fam.extends:
        head += "\n" + escape_controls(f"# extends {fam.extends} (inherited entries merged below)")
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return head + "\n" + yaml.dump(doc, Dumper=dumper, sort_keys=False, width=110, allow_unicode=True)


def rule_check_line(check: Any) -> str:
    """``ok: PATH`` or ``invalid: PATH: where: problem`` for one readiness.validate.RuleFileCheck."""
    from ckptinspect.escape import escape_controls

    return escape_controls(f"ok: {check.path}" if check.error is None else f"invalid: {check.error}")
