"""Speculative (MTP) settings: step counts, tree-drafting attention, and the draft's own MoE runner.

The draft's MoE runner defaults to the target's; when the MTP experts are stored in another kind
(BF16 draft next to NVFP4 / FP8 experts, the seed case on SM120) the rules in
rules/engines/sglang.yaml `draft` say whether the target's runner runs that kind on this arch.
"""

from __future__ import annotations

from collections import Counter

from ckptinspect.plan.backends import Choice, arch_class, resolved_value
from ckptinspect.plan.command import FlagLine
from ckptinspect.plan.rules import PlanFacts, engine_rules
from ckptinspect.records import Checkpoint, MtpAssessment


def draft_expert_kind(ck: Checkpoint) -> str | None:
    """Quantization kind of the MTP layer's routed experts (by bytes), None without MTP experts."""
    by_scheme: Counter[str] = Counter()
    for g in ck.inventory.mtp_groups():
        if g.component == "routed_expert" and g.params:
            by_scheme[g.scheme] += g.bytes
    if not by_scheme:
        return None
    scheme = by_scheme.most_common(1)[0][0]
    return next((k["id"] for k in engine_rules("common")["quant_kinds"] if scheme in k["schemes"]), scheme)


def draft_moe_flags(ck: Checkpoint, facts: PlanFacts, target_kind: str, choices: tuple[Choice, ...]) -> tuple[FlagLine, ...]:
    """--speculative-moe-runner-backend when the target's runner cannot run the draft's expert kind here."""
    draft = draft_expert_kind(ck)
    if draft is None or draft == target_kind:
        return ()
    rules = engine_rules("sglang")["draft"]
    runs = rules["runs"].get(draft)
    if runs is None:
        return ()
    # SG:arg_groups/overrides.py _speculative_moe_runner_default: the draft runner is the target's
    # *resolved* runner (auto already replaced, e.g. flashinfer_cutlass for modelopt_fp4 on SM120).
    target = resolved_value("sglang", "moe_runner_backend", facts, choices) or "auto"
    cls = arch_class("sglang", facts.arch)
    valid = runs.get(cls, [])
    if target in valid:
        return ()
    pick = rules["fallback"][draft]
    reason = (f"the MTP experts are {draft} but the target's --moe-runner-backend {target} (the draft's default) "
              f"is not listed as running {draft} experts on {facts.arch}; the draft takes {pick}")
    return (FlagLine("--speculative-moe-runner-backend", pick, reason,
                     f"{rules['source']}; {rules['runner_default_source']}"),)


def tree_draft_attention(choices: tuple[Choice, ...], facts: PlanFacts) -> tuple[Choice, ...]:
    """Swap the attention backend for one that supports --speculative-eagle-topk > 1."""
    rules = engine_rules("sglang")
    allowed = rules["speculative"]["topk_gt1_backends"]
    valid = rules["settings"]["attention_backend"]["valid"].get(arch_class("sglang", facts.arch), allowed)
    out = []
    for c in choices:
        if c.setting == "attention_backend" and c.value not in allowed:
            pick = next((b for b in allowed if b in valid), allowed[-1])
            c = Choice(c.setting, c.flag, pick, f"probe asks for eagle_topk > 1, which {c.value} cannot run",
                       rules["speculative"]["topk_source"])
        out.append(c)
    return tuple(out)



def spec_values(engine: str, mtp: MtpAssessment, goal: str, probe: dict | None) -> tuple[dict, str]:
    rules = engine_rules(engine)["speculative"]
    verdict = mtp.verdicts[engine]
    rec = ((probe or {}).get("recommendation") or {}).get(engine) or {}
    origin = "probe report" if rec else "engine defaults"
    why = f"MTP verdict {verdict.verdict}: draft with the checkpoint's {verdict.layers_used} MTP layer(s)"
    if engine == "sglang":
        algo = (verdict.method or rules["default_algorithm"]).upper()
        if algo not in rules["algorithms"]:
            algo = rules["default_algorithm"]
        resolving = (rules.get("self_resolving") or {}).get(algo)
        if resolving is not None:
            return {"algorithm": algo, "from": "engine defaults", "source": resolving["source"]}, \
                f"{why}; {resolving['reason']}"
        d = rules["defaults"]
        values = {"algorithm": algo,
                  "num_steps": int(rec.get("num_steps", d["num_steps"])),
                  "eagle_topk": int(rec.get("eagle_topk", d["eagle_topk"])),
                  "num_draft_tokens": int(rec.get("num_draft_tokens", d["num_draft_tokens"])),
                  "from": origin, "source": "probe --report" if rec else rules["source"]}
        return values, f"{why} (NEXTN = EAGLE in SGLang)"
    other = (rules.get("other_methods") or {}).get(verdict.method or "")
    if other is not None:
        values = {"method": verdict.method, "from": "engine defaults", "source": other["source"]}
        if other.get("num_speculative_tokens") is not None:
            values["num_speculative_tokens"] = int(other["num_speculative_tokens"])
        return values, why
    k = int(rec.get("num_speculative_tokens", rules["num_speculative_tokens"][goal]))
    values = {"method": rules["method"], "num_speculative_tokens": k, "from": origin,
              "source": "probe --report" if rec else rules["source"]}
    cap = (rules.get("max_tokens_by_draft") or {}).get(verdict.draft_architecture or "")
    if cap is not None and k > cap["max"]:  # the engine refuses more steps than the draft was trained for
        values.update(num_speculative_tokens=cap["max"], source=cap["source"])
        why = f"{why}; {verdict.draft_architecture} has {cap['max']} trained step(s)"
    return values, why
