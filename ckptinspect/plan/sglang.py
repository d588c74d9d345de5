"""SGLang 0.5.23 `python -m sglang.launch_server` command with a reason per flag."""

from __future__ import annotations

from ckptinspect.plan.command import Command, FlagLine, LaunchInputs, choice_lines
from ckptinspect.plan.rules import engine_rules

SRV = "SG:server_args.py"


def sglang_command(inp: LaunchInputs) -> Command:
    rules = engine_rules("sglang")
    flags = [
        FlagLine("--model-path", inp.model_path, "checkpoint to serve", SRV),
        FlagLine("--tp-size", str(inp.tp), f"tensor parallel over the {inp.tp} GPUs; passes every divisibility check and fits",
                 "ckptinspect plan: fit + divisibility checks (rules/engines/common.yaml)"),
    ]
    if inp.revision:
        flags.insert(1, FlagLine("--revision", inp.revision, "the Hub revision the plan was sized for", SRV))
    if inp.ep > 1:
        flags.append(FlagLine("--ep-size", str(inp.ep), "expert parallel: whole experts per rank, so expert shapes "
                              "are not split and the per-rank expert checks pass", "SG:layers/moe (moe_tp_size = tp / ep)"))
    flags.extend(choice_lines(inp.choices))
    flags.append(FlagLine("--mem-fraction-static", f"{inp.mem_fraction:g}", inp.mem_fraction_reason,
                          inp.mem_fraction_source))
    flags.append(FlagLine("--context-length", str(inp.context), "context the KV pool was sized for", SRV))
    flags.append(FlagLine("--max-running-requests", str(inp.max_running_requests), inp.running_reason,
                          inp.running_source))
    if inp.parsers:
        if inp.parsers.get("reasoning"):
            flags.append(FlagLine("--reasoning-parser", inp.parsers["reasoning"], "splits thinking from the answer",
                                  inp.parsers["source"]))
        if inp.parsers.get("tool"):
            flags.append(FlagLine("--tool-call-parser", inp.parsers["tool"], "parses this family's tool-call format",
                                  inp.parsers["source"]))
    caveats: list[str] = list(inp.caveats)
    if inp.spec_enabled:
        spec = rules["speculative"]
        src = inp.spec.get("source", spec["source"])
        algo_src = spec["source"] if "num_steps" in inp.spec else src  # DSPARK: the hook that resolves it
        flags.append(FlagLine("--speculative-algorithm", inp.spec["algorithm"], inp.spec_reason, algo_src))
        if "num_steps" in inp.spec:  # absent for algorithms SGLang resolves itself (DSPARK)
            flags.append(FlagLine("--speculative-num-steps", str(inp.spec["num_steps"]),
                                  "draft steps per verify (one MTP layer re-run each step)", src))
            flags.append(FlagLine("--speculative-eagle-topk", str(inp.spec["eagle_topk"]),
                                  "one branch per step: chain drafting, works with every attention backend", src))
            flags.append(FlagLine("--speculative-num-draft-tokens", str(inp.spec["num_draft_tokens"]),
                                  "tokens verified per step (steps + 1 for topk 1)", src))
        flags.extend(inp.draft_flags)
        if inp.goal == "throughput":
            caveats.append(f"{spec['throughput_caveat']} ({spec['caveat_source']})")
    if inp.trust_remote_code:
        flags.append(FlagLine("--trust-remote-code", None, "config uses auto_map remote code", SRV))
    return Command("sglang", rules["version"], tuple(rules["launcher"].split()), (), tuple(flags), (),
                   inp.avoid, tuple(caveats))
