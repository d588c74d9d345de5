"""vLLM 0.33.0 `vllm serve` command with a reason per flag; MTP through --speculative-config JSON."""

from __future__ import annotations

import json

from ckptinspect.plan.backends import env_for
from ckptinspect.plan.rules import PlanFacts
from ckptinspect.plan.command import Command, EnvLine, FlagLine, LaunchInputs, choice_lines
from ckptinspect.plan.rules import engine_rules

ARGS = "VL:engine/arg_utils.py"


def vllm_command(inp: LaunchInputs, facts: PlanFacts) -> Command:
    rules = engine_rules("vllm")
    flags = [FlagLine("--tensor-parallel-size", str(inp.tp), f"tensor parallel over {inp.tp} GPUs", ARGS)]
    if inp.revision:
        flags.insert(0, FlagLine("--revision", inp.revision, "the Hub revision the plan was sized for", ARGS))
    if inp.ep > 1:
        flags.append(FlagLine("--enable-expert-parallel", None,
                              f"experts sharded over the {inp.ep} ranks (EP size = TP x DP in vLLM)", ARGS))
    flags.extend(choice_lines(inp.choices))
    flags.append(FlagLine("--gpu-memory-utilization", f"{inp.mem_fraction:g}", inp.mem_fraction_reason,
                          inp.mem_fraction_source))
    flags.append(FlagLine("--max-model-len", str(inp.context), "context the KV pool was sized for", ARGS))
    flags.append(FlagLine("--max-num-seqs", str(inp.max_running_requests), inp.running_reason, inp.running_source))
    if inp.parsers:
        if inp.parsers.get("reasoning"):
            flags.append(FlagLine("--reasoning-parser", inp.parsers["reasoning"], "splits thinking from the answer",
                                  inp.parsers["source"]))
        if inp.parsers.get("tool"):
            flags.append(FlagLine("--enable-auto-tool-choice", None, "lets the model decide to call tools",
                                  "VL:entrypoints/common/cli_args.py"))
            flags.append(FlagLine("--tool-call-parser", inp.parsers["tool"], "parses this family's tool-call format",
                                  inp.parsers["source"]))
    caveats: list[str] = list(inp.caveats)
    if inp.spec_enabled:
        spec = rules["speculative"]
        config = {k: inp.spec[k] for k in ("method", "num_speculative_tokens") if k in inp.spec}
        flags.append(FlagLine("--speculative-config", json.dumps(config, separators=(",", ":")), inp.spec_reason,
                              inp.spec.get("source", spec["source"])))
        if inp.goal == "throughput":
            caveats.append(f"{spec['throughput_caveat']} ({spec['caveat_source']})")
    if inp.trust_remote_code:
        flags.append(FlagLine("--trust-remote-code", None, "config uses auto_map remote code", ARGS))
    env = tuple(EnvLine(*e) for e in env_for("vllm", facts))
    return Command("vllm", rules["version"], tuple(rules["launcher"].split()), (inp.model_path,), tuple(flags), env,
                   inp.avoid, tuple(caveats))
