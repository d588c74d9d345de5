"""Regenerate every example output in the docs, so that none can go stale.

    python scripts/gen_docs.py            # rewrite the blocks in place
    python scripts/gen_docs.py --check    # exit 1 naming each stale block (tests/test_docs.py does this)

A block sits between ``<!-- gen:NAME -->`` and ``<!-- /gen:NAME -->`` in a Markdown file; NAME is a
key of BLOCKS below, whose function runs the real command (through the library API, the renderers
and, where the exit code or stderr is the point, the CLI itself) on the bundled example, generated
fixtures or the full-scale replica. Machine-specific parts (temp directories, ports, the checkout
path) are replaced by placeholders: FIXTURES, <replica>, <port>, <hf-cache>.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DOC_FILES = ("README.md", "CONTRIBUTING.md", "docs/json_contract.md", "docs/rules_format.md",
             "docs/hub_and_wire.md", "docs/plan.md", "docs/gguf.md", "docs/audit.md", "docs/security.md")
MARKER = re.compile(r"(<!-- gen:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /gen:(?P=name) -->)", re.S)
DOC_WIDTH = 100  # the text examples are shown as a 100-column terminal prints them
VERDICT_FIXTURES = ("qwen3_5_moe_nvfp4", "qwen3_5_moe_nvfp4_nomtp", "qwen3_5_moe_mtp_incomplete",
                    "qwen3_5_moe_mtp_partial_quant", "qwen3_next_bf16", "deepseek_v3_nvfp4_mtp_fp4",
                    "deepseek_v3_depth_mismatch", "mimo_v2_flash", "minimax_m2", "kimi_k2")


class Context:
    """Inputs shared by the blocks, built on first use (fixtures in a temp dir, the replica)."""

    def __init__(self, replica: Path | None = None) -> None:
        # Under /tmp whatever TMPDIR says: the outputs are wrapped before their paths become placeholders,
        # so the temporary path must have the same length on every machine.
        self._tmp = tempfile.TemporaryDirectory(prefix="ckptinspect-docs-", dir="/tmp" if Path("/tmp").is_dir() else None)
        self.tmp = Path(self._tmp.name)
        self._fixtures: dict[str, Path] = {}
        self._replica = replica

    def fixture(self, name: str) -> Path:
        if name not in self._fixtures:
            from fixtures.generate import build_fixture

            self._fixtures[name] = build_fixture(name, self.tmp / "fixtures")
        return self._fixtures[name]

    def gguf(self, name: str) -> Path:
        """The directory of one fixtures/gguf_models.py model (all of them are written on first use)."""
        from fixtures.gguf_models import MODEL_DIRS, build

        root = self.tmp / "gguf"
        if not root.is_dir():
            build(root)
        return root / MODEL_DIRS[name]

    def replica(self) -> Path:
        if self._replica is None:
            from fixtures.replica import build_replica

            self._replica = build_replica(self.tmp / "replica")
        return self._replica

    def clean(self, text: str) -> str:
        """Placeholders for the machine-specific paths."""
        out = text.replace(str(self.tmp / "fixtures") + "/", "FIXTURES/").replace(str(self.tmp / "gguf") + "/", "GGUF/")
        if self._replica is not None:
            out = out.replace(str(self._replica), "<replica>")
        out = out.replace(str(self.tmp / "hf-cache"), "<hf-cache>")
        return out.replace(str(ROOT) + "/", "")

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        full_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "CKPTINSPECT_DEBUG", "COLUMNS")}
        full_env.update({"PYTHONPATH": str(ROOT), "COLUMNS": str(DOC_WIDTH)}, **(env or {}))
        return subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True,
                              env=full_env, cwd=str(ROOT), timeout=300)

    def close(self) -> None:
        self._tmp.cleanup()


def fence(lang: str, text: str) -> str:
    return f"```{lang}\n{text.rstrip()}\n```\n"


# -- the blocks -------------------------------------------------------------------------------------
def bundled_report(ctx: Context) -> str:
    res = ctx.cli("report")
    assert res.returncode == 0, res.stderr
    return fence("text", "$ ckptinspect report\n" + ctx.clean(res.stdout))


def bundled_json(ctx: Context) -> str:
    res = ctx.cli("report", "--format", "json")
    assert res.returncode == 0, res.stderr
    return fence("json", ctx.clean(res.stdout))


def fail_on_gate(ctx: Context) -> str:
    path = ctx.fixture("deepseek_v3_nvfp4_nomtp")
    res = ctx.cli("report", str(path), "--engine", "vllm", "--fail-on", "unusable", "--quiet")
    shown = f"$ ckptinspect report {path} --engine vllm --fail-on unusable --quiet >/dev/null; echo $?"
    return fence("text", ctx.clean(f"{shown}\n{res.stderr}{res.returncode}"))


def rules_list(ctx: Context) -> str:
    res = ctx.cli("rules", "list")
    assert res.returncode == 0, res.stderr
    return fence("text", "$ ckptinspect rules list\n" + res.stdout)


def rules_validate_bad(ctx: Context) -> str:
    from ckptinspect.readiness.loader import builtin_dir

    good = (builtin_dir() / "deepseek_v3.yaml").read_text(encoding="utf-8")
    bad = ctx.tmp / "bad.yaml"
    bad.write_text(good.replace("layer_use: reuse_first", "layer_use: sometimes", 1), encoding="utf-8")
    res = ctx.cli("rules", "validate", str(bad))
    assert res.returncode == 2, res.stdout + res.stderr
    return fence("text", f"$ ckptinspect rules validate bad.yaml\n{res.stderr.replace(str(bad), 'bad.yaml')}")


def fixture_verdicts(ctx: Context) -> str:
    from ckptinspect import api

    rows = []
    for name in VERDICT_FIXTURES:
        mtp = api.inspect(str(ctx.fixture(name))).mtp
        verdicts = {e: mtp.verdicts[e] for e in ("sglang", "vllm")}
        if not rows:  # the versions the rules answer for (the newest releases)
            rows.append(f"{'fixture':<31} {'SGLang ' + verdicts['sglang'].engine_version:<14} "
                        f"{'vLLM ' + verdicts['vllm'].engine_version:<12} reasons (sglang | vllm)")
        reasons = " | ".join(",".join(v.reasons) or "-" for v in verdicts.values())
        rows.append(f"{name:<31} {verdicts['sglang'].verdict:<14} {verdicts['vllm'].verdict:<12} {reasons}")
    return fence("text", "\n".join(rows))


def diff_example(ctx: Context) -> str:
    a, b = ctx.fixture("deepseek_v3_nvfp4"), ctx.fixture("deepseek_v3_nvfp4_mtp_fp4")
    res = ctx.cli("diff", str(a), str(b), "--limit", "5", "--wide")
    assert res.returncode == 0, res.stderr
    return fence("text", ctx.clean(f"$ ckptinspect diff {a} {b} --limit 5\n{res.stdout}"))


def plan_example(ctx: Context) -> str:
    from ckptinspect import api
    from ckptinspect.render.plan_out import render_plan

    replica = ctx.replica()
    plan = api.plan(str(replica), gpu="rtx-pro-6000", gpus=8, engine="sglang")
    text = render_plan(plan, "text")
    return fence("text", ctx.clean(f"$ ckptinspect plan {replica} --gpu rtx-pro-6000 --gpus 8 --engine sglang "
                                   f"--wide\n{text}"))


def plan_gpu_memory(ctx: Context) -> str:
    """The head of a plan with --gpu-memory (the lines that change with the memory), and its notes."""
    from ckptinspect import api
    from ckptinspect.render.plan_out import render_plan

    replica = ctx.replica()
    plan = api.plan(str(replica), gpu=api.find_gpu("NVIDIA H200", memory_gib=48), gpus=8, engine="both")
    lines = render_plan(plan, "text").splitlines()
    head = lines[2:lines.index("")]
    notes = [line for line in lines if "(--gpu-memory)" in line or "shared with other jobs" in line]
    return fence("text", ctx.clean(f'$ ckptinspect plan {replica} --gpu "NVIDIA H200" --gpus 8 --gpu-memory 48 '
                                   f"--wide\n" + "\n".join(head) + "\n...\n" + "\n".join(notes) + "\n"))


def offline_error(ctx: Context) -> str:
    cache = ctx.tmp / "hf-cache"
    commit = "0" * 40
    storage = cache / "models--org--tiny"
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    example = ROOT / "ckptinspect" / "examples" / "qwen3_5_moe_nvfp4_tiny"
    for name in ("config.json", "model.safetensors.index.json"):
        (snapshot / name).write_bytes((example / name).read_bytes())
    res = ctx.cli("report", "org/tiny", env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)})
    assert res.returncode == 2, res.stderr
    return fence("text", ctx.clean(f"$ HF_HUB_OFFLINE=1 ckptinspect report org/tiny\n{res.stderr}"))


def network_error(ctx: Context) -> str:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    res = ctx.cli("report", "org/tiny", env={"HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(ctx.tmp / "empty-cache"),
                                             "CKPTINSPECT_HTTP_BACKOFF_S": "0.01"})
    assert res.returncode == 2, res.stderr
    text = res.stderr.replace(str(port), "<port>")
    return fence("text", f"$ HF_ENDPOINT=http://127.0.0.1:<port> ckptinspect report org/tiny   # nothing listens\n{text}")


def broken_fixture_errors(ctx: Context) -> str:
    from ckptinspect import api
    from ckptinspect.cli.messages import explain
    from ckptinspect.errors import CkptInspectError
    from fixtures.generate import FIXTURES

    rows = []
    for name in sorted(n for n in FIXTURES if n.startswith("broken_")):
        try:
            api.inspect(str(ctx.fixture(name)))
        except CkptInspectError as exc:
            rows.append(f"{name:<30} error: {ctx.clean(explain(exc))}")
        else:
            raise AssertionError(f"{name} was read without an error")
    return fence("text", "\n".join(rows))


def fixture_table(ctx: Context) -> str:
    from fixtures.generate import FIXTURES

    lines = ["| Fixture | Family | Tensors | MTP tensors | Shards | What it is |", "|---|---|---:|---:|---:|---|"]
    for name, spec in FIXTURES.items():
        notes = " ".join(spec.notes.split()).replace("|", "\\|")
        lines.append(f"| `{name}` | {spec.family} | {spec.expected_tensors} | {spec.mtp_tensors} | "
                     f"{len(spec.shards)} | {notes} |")
    return "\n".join(lines) + "\n"


def gguf_verdicts(ctx: Context) -> str:
    from ckptinspect import api
    from fixtures.gguf_models import MODELS

    rows = [f"{'GGUF fixture':<31} {'head':<10} {'llama.cpp b11058':<17} reason"]
    for name in MODELS:
        report = api.inspect(str(ctx.gguf(name)))
        mtp, own = report.mtp, {sh.name for sh in report.checkpoint.inventory.shards}
        v = mtp.verdicts["llamacpp"]
        files = {f for layer in mtp.layers for f in layer.shards}
        where = ("companion" if files - own else "inside" if files else "missing" if mtp.declared_layers else "none")
        rows.append(f"{name:<31} {where:<10} {v.verdict:<17} {','.join(v.reasons)}")
    return fence("text", "\n".join(rows))


def gguf_report(ctx: Context) -> str:
    path = ctx.gguf("GLM-4.5-Air-trunk-Q4_K_M")
    res = ctx.cli("report", str(path))
    assert res.returncode == 0, res.stderr
    return fence("text", ctx.clean(f"$ ckptinspect report {path}\n{res.stdout}"))


def gguf_plan(ctx: Context) -> str:
    path = ctx.gguf("GLM-4.5-Air-IQ3_S")
    res = ctx.cli("plan", str(path), "--gpu", "rtx-5090", "--gpus", "1", "--context", "32768")
    assert res.returncode == 0, res.stderr
    return fence("text", ctx.clean(f"$ ckptinspect plan {path} --gpu rtx-5090 --gpus 1 --context 32768\n{res.stdout}"))


# The audit example: generated Qwen3.5-layout quants served as the quants of one base model by the test
# Hub server (tests/hub_server.py); names say they are examples, not Hub repos.
AUDIT_BASE = "example/Qwen3.5-tiny"
AUDIT_REPOS = {"example-a/Qwen3.5-tiny-NVFP4": "qwen3_5_moe_nvfp4",
               "example-a/Qwen3.5-tiny-NVFP4-fused": "qwen3_5_moe_nvfp4_fused",
               "example-b/Qwen3.5-tiny-W4A4-ct": "qwen3_5_moe_ct_nvfp4",
               "example-b/Qwen3.5-tiny-GPTQ-Int4": "qwen3_5_moe_gptq_int4_bf16_mtp",
               "example-c/Qwen3.5-tiny-NVFP4-noMTP": "qwen3_5_moe_nvfp4_nomtp",
               "example-c/Qwen3.5-tiny-NVFP4-mtp-cut": "qwen3_5_moe_mtp_incomplete",
               "example-d/Qwen3.5-tiny-broken": "broken_truncated_header"}


def audit_runs(ctx: Context, *args: str) -> subprocess.CompletedProcess:
    sys.path.insert(0, str(ROOT / "tests"))
    from hub_server import HubServer

    with HubServer() as server:
        for repo, fixture in AUDIT_REPOS.items():
            server.add_repo(repo, ctx.fixture(fixture), tags=(f"base_model:quantized:{AUDIT_BASE}",))
        return ctx.cli("audit", *args, env={"HF_ENDPOINT": server.url, "HF_HOME": str(ctx.tmp / "audit-hf"),
                                            "CKPTINSPECT_CACHE_DIR": str(ctx.tmp / "audit-cache"), "HF_TOKEN": ""})


AUDIT_ARGS = ("--quantized-from", AUDIT_BASE, "--gpu", "h200", "--gpus", "1", "--no-cache")


def audit_example(ctx: Context) -> str:
    """The markdown table as is (it renders as a table where the docs are read)."""
    res = audit_runs(ctx, *AUDIT_ARGS, "--format", "markdown")
    assert res.returncode == 0, res.stderr
    return fence("text", f"$ ckptinspect audit {' '.join(AUDIT_ARGS)} --format markdown") + "\n" + ctx.clean(res.stdout)


def audit_text(ctx: Context) -> str:
    res = audit_runs(ctx, *AUDIT_ARGS, "--wide")
    assert res.returncode == 0, res.stderr
    return fence("text", f"$ ckptinspect audit {' '.join(AUDIT_ARGS)} --wide\n" + ctx.clean(res.stdout))


def audit_jsonl(ctx: Context) -> str:
    res = audit_runs(ctx, "example-a/Qwen3.5-tiny-NVFP4", "--gpu", "h200", "--gpus", "1", "--format", "jsonl",
                     "--no-cache")
    assert res.returncode == 0, res.stderr
    return fence("json", json.dumps(json.loads(res.stdout), indent=2))


def settings_table(ctx: Context) -> str:
    """Every setting, from the table the code parses them with (ckptinspect/settings.py VARIABLES)."""
    from ckptinspect.settings import VARIABLES

    rows = ["| Variable | Flag | Default | Allowed | Sets |", "|---|---|---|---|---|"]
    for v in VARIABLES:
        rows.append(f"| `{v.name}` | {f'`{v.flag}`' if v.flag else ''} | {v.default} | {v.kind}: {v.bounds()} "
                    f"| {v.doc} |")
    return "\n".join(rows) + "\n"


BLOCKS: dict[str, Callable[[Context], str]] = {
    "settings-table": settings_table,
    "gguf-verdicts": gguf_verdicts,
    "gguf-report": gguf_report,
    "gguf-plan": gguf_plan,
    "audit-example": audit_example,
    "audit-text": audit_text,
    "audit-jsonl": audit_jsonl,
    "bundled-report": bundled_report,
    "bundled-json": bundled_json,
    "fail-on-gate": fail_on_gate,
    "rules-list": rules_list,
    "rules-validate-bad": rules_validate_bad,
    "fixture-verdicts": fixture_verdicts,
    "diff-example": diff_example,
    "plan-example": plan_example,
    "plan-gpu-memory": plan_gpu_memory,
    "offline-error": offline_error,
    "network-error": network_error,
    "broken-fixture-errors": broken_fixture_errors,
    "fixture-table": fixture_table,
}


def regenerate(text: str, ctx: Context, cache: dict[str, str]) -> str:
    """``text`` with every marked block replaced by its fresh output (unknown names are an error)."""
    def replace(m: re.Match) -> str:
        name = m.group("name")
        if name not in BLOCKS:
            raise KeyError(f"unknown generated block {name!r}")
        if name not in cache:
            cache[name] = BLOCKS[name](ctx)
        return m.group(1) + cache[name] + m.group(4)

    return MARKER.sub(replace, text)


def stale_blocks(ctx: Context, files: tuple[str, ...] = DOC_FILES) -> dict[str, str]:
    """file -> its regenerated text, for each file whose blocks differ from what is on disk."""
    cache: dict[str, str] = {}
    out = {}
    for rel in files:
        path = ROOT / rel
        current = path.read_text(encoding="utf-8")
        fresh = regenerate(current, ctx, cache)
        if fresh != current:
            out[rel] = fresh
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a block is stale; write nothing")
    ap.add_argument("--replica", type=Path, default=None, help="an already built full-scale replica")
    args = ap.parse_args(argv)
    ctx = Context(args.replica)
    try:
        stale = stale_blocks(ctx)
    finally:
        ctx.close()
    for rel, text in stale.items():
        if args.check:
            print(f"stale: {rel} (run python scripts/gen_docs.py)")
        else:
            (ROOT / rel).write_text(text, encoding="utf-8")
            print(f"rewrote {rel}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
