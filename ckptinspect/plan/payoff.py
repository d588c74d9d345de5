"""Whether MTP pays off on the user's workload: what decides it, and the probe command that measures it.

A verdict of READY says the engine can load and run the draft, not that drafting is faster: the gain
is set by how many drafts the target accepts on the user's own traffic (acceptance) and by how busy
the server is (a verify step costs more as the batch grows, so the speedup shrinks with concurrency).
Random-token benchmarks accept almost no drafts, so they show no gain whatever the checkpoint. The
probe measures acceptance on real prompts and projects the speedup per batch size on a named GPU;
`plan --probe-report` then takes its recommendation, and drops the speculative flags when it projects
no gain (launch.py), so no output recommends drafting next to a projection that it does not pay.
"""

from __future__ import annotations

import shlex

from ckptinspect.plan.gpus import GpuSpec
from ckptinspect.plan.serve_target import serve_target
from ckptinspect.records import TOKENIZER_FILES, Checkpoint, has_tokenizer

# The probe dequantizes to BF16 and keeps ~10% of the device for activations and scoring
# (docs/probe.md, batch-size rule: at most 90% of the free device memory).
_BF16_BYTES = 2
_DEVICE_SHARE = 0.9

WHAT_DECIDES = ("whether MTP pays off is decided by draft acceptance on your own traffic and by concurrency "
                "(the gain shrinks as more requests share each verify step); random-token benchmarks "
                "(e.g. --dataset-name random) accept almost no drafts and show no gain")


def probe_command(ck: Checkpoint, gpu: GpuSpec) -> str:
    """The `ckptinspect probe` command for ``ck``, with the cost model on ``gpu``; layer-streamed teacher
    mode when the BF16 weights do not fit one such GPU."""
    model, _ = serve_target(ck)
    args = ["ckptinspect", "probe", model, "--gpu", gpu.aliases[0] if gpu.aliases else gpu.name]
    if gpu.spec_file:  # a card of the user's GPU file: the probe's cost model reads the same file
        args += ["--gpu-spec", gpu.spec_file]
    budget_gib = int(gpu.memory_gib * _DEVICE_SHARE)
    if ck.inventory.totals.params * _BF16_BYTES > budget_gib * 2**30:
        args += ["--mode", "teacher", "--max-gpu-memory", str(budget_gib)]
    args += ["--format", "json", "-o", "probe.json"]
    return " ".join(shlex.quote(a) for a in args)


def report_line(ck: Checkpoint, gpu: GpuSpec | None) -> str:
    """The report's short answer to "will MTP pay on my workload?" (``gpu``: the report's plan GPU)."""
    if ck.format == "gguf":  # the probe runs safetensors checkpoints only (api.probe refuses GGUF)
        return ("depends on draft acceptance on your own traffic and on concurrency (random-token benchmarks "
                "show no gain); ckptinspect probe does not run GGUF files: measure with llama-server's own "
                "draft-acceptance statistics on your prompts")
    if not has_tokenizer(ck.files):  # the probe needs the model's own tokenizer: no dead-end command
        return ("depends on draft acceptance on your own traffic and on concurrency (random-token benchmarks "
                f"show no gain); `ckptinspect probe` measures it but needs the model's tokenizer, which this "
                f"checkpoint does not include (none of {', '.join(TOKENIZER_FILES)}): probe the repo it was "
                "made from, or add the tokenizer files")
    if gpu is not None:
        command = probe_command(ck, gpu)
    else:
        model, _ = serve_target(ck)
        command = f"ckptinspect probe {shlex.quote(model)} --gpu YOUR_GPU"
    return (f"depends on draft acceptance on your own traffic and on concurrency (random-token benchmarks "
            f"show no gain); measure: `{command}`")


def payoff_note(ck: Checkpoint, gpu: GpuSpec) -> str:
    """The plan's note when it drafts without a probe report."""
    if not has_tokenizer(ck.files):
        return (f"{WHAT_DECIDES}; `ckptinspect probe` measures it but needs the model's tokenizer, which this "
                "checkpoint does not include: probe the repo it was made from and pass --probe-report probe.json")
    return (f"{WHAT_DECIDES}; measure it on this GPU with `{probe_command(ck, gpu)}` and pass "
            f"--probe-report probe.json")


def probe_gpu_mismatch(probe_report: dict, gpu: GpuSpec) -> str:
    """Why a probe report's projection does not hold for ``gpu`` ("" when it was made for it)."""
    from ckptinspect.errors import PlanError
    from ckptinspect.plan.gpus import find_gpu

    cost = probe_report.get("cost_model")
    named = cost.get("gpu") if isinstance(cost, dict) else None
    if not isinstance(named, str) or not named:
        return ""
    try:
        same = find_gpu(named).name == gpu.name
    except PlanError:
        same = False
    if same:
        return ""
    return (f"the probe report projects its speedup on {named}, not {gpu.name}: rerun the probe with "
            f"--gpu {gpu.aliases[0] if gpu.aliases else gpu.name}")
