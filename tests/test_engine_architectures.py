"""rules/engines/architectures.yaml against the engines' own registries, and what report and plan make of it.

The data file is written by scripts/engine_architectures.py from the engines' source files (never
imported); here the installed engines answer for themselves: vLLM 0.32.0's
``ModelRegistry.get_supported_archs()`` in its CPU environment, SGLang 0.5.23's in its test install (a
subprocess each), and transformers 5.19.0 (the release SGLang pins) for the Transformers-fallback list.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckptinspect.pipeline import build_report
from ckptinspect.readiness.engine_archs import ARCH_UNKNOWN, arch_support, registry
from tests.sglang_quant_oracle import SGLANG_STUB_PRELUDE

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "engine_architectures.py"


def _script():
    spec = importlib.util.spec_from_file_location("engine_architectures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _names(engine: str, version: str) -> set[str]:
    entry = registry(engine, version)
    assert entry is not None, f"{engine} {version} missing from rules/engines/architectures.yaml"
    return set(entry["architectures"])


def _run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                          cwd=str(ROOT))


def test_the_data_file_matches_the_engine_sources_on_this_machine():
    res = _run_script("--check")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "matches every source checked" in res.stdout


def test_check_fails_when_an_engine_version_lost_or_gained_a_name(tmp_path):
    data = ROOT / "rules" / "engines" / "architectures.yaml"
    stale = tmp_path / "architectures.yaml"
    # vLLM 0.34.0's is the only entry naming it: one name lost and one gained there
    assert data.read_text().count(" MistralLarge4ForCausalLM,") == 1
    stale.write_text(data.read_text().replace(" MistralLarge4ForCausalLM,", " MistralLarge4XForCausalLM,"))
    sources = _script().DEFAULT_SOURCES[("vllm", "0.34.0")]
    if not any(p.exists() for p in sources):
        pytest.skip(f"vLLM 0.34.0's source is not on this machine ({', '.join(map(str, sources))})")
    res = _run_script("--check", "--data", str(stale))
    assert res.returncode == 1 and "stale for: vllm 0.34.0" in res.stdout, res.stdout


def test_vllm_registry_equals_the_data():
    import vllm_engine

    python = vllm_engine.engine_python()
    code = ("import json\nfrom vllm.model_executor.models.registry import ModelRegistry\n"
            "print('@@' + json.dumps(sorted(ModelRegistry.get_supported_archs())))")
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, env=vllm_engine.engine_env(),
                          timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("@@")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    assert set(json.loads(line[2:])) == _names("vllm", "0.32.0")


def test_transformers_fallback_list_equals_transformers_5_19():
    """The generating classes ``getattr(transformers, arch)`` finds, asked of transformers 5.19.0 itself (in
    the vLLM 0.32.0 environment, which installs that release)."""
    import vllm_engine

    python = vllm_engine.engine_python()
    code = ("import json, transformers\nprint('@@' + json.dumps([transformers.__version__, sorted(n for n in "
            "dir(transformers) if n.endswith(('ForCausalLM', 'ForConditionalGeneration', 'ChatModel', "
            "'LMHeadModel')))]))")
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, env=vllm_engine.engine_env(),
                          timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("@@")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    version, names = json.loads(line[2:])
    assert version == "5.19.0" and registry("sglang", "0.5.23")["transformers"] == "==5.19.0"
    assert set(names) == _names("transformers", "5.19.0")


# SGLang imports every model module to build its registry; this CPU test install lacks a few GPU packages,
# stood in for as tests/sglang_quant_oracle.py does. Three modules still fail here for CUDA itself
# (SG:layers/attention/mamba/mamba.py defines causal_conv1d_fn only on CUDA; models/inkling.py builds on
# NVIDIA's cuda-python and CUDA streams at import): their classes are checked by reading them, not by
# SGLang's answer.
SGLANG_STUBBED = ("tvm_ffi", "torchvision", "torchaudio", "sentencepiece", "gguf", "loguru", "uvicorn", "fastapi",
                  "cutlass", "setproctitle", "quack")
SGLANG_CUDA_ONLY = {"sglang.srt.models.mamba", "sglang.srt.models.falcon_mamba", "sglang.srt.models.inkling"}
_SGLANG_REGISTRY = SGLANG_STUB_PRELUDE + r"""
failed = []
class _Failed(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Ignore import error when loading "):
            failed.append(message[len("Ignore import error when loading "):].split(":")[0])
logging.getLogger("sglang.srt.models.registry").addHandler(_Failed())
from sglang.srt.models.registry import ModelRegistry
print("@@" + json.dumps({"archs": sorted(ModelRegistry.get_supported_archs()), "failed": failed}))
"""


def test_sglang_registry_equals_the_data():
    from tests.test_verify import sglang_environment

    python, path = sglang_environment()
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.run([python, "-c", _SGLANG_REGISTRY, ",".join(SGLANG_STUBBED)], capture_output=True,
                          text=True, env=env, timeout=900, cwd="/")
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("@@")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    answer = json.loads(line[2:])
    assert set(answer["failed"]) == SGLANG_CUDA_ONLY, answer["failed"]
    script = _script()
    src = script.Source(Path(path.split(os.pathsep)[0]))
    unread = set()
    for module in SGLANG_CUDA_ONLY:
        import ast

        tree = ast.parse(src.read(module.replace(".", "/") + ".py"))
        entry = script._entry_class(tree)
        unread |= {script._class_name(tree, e, module) for e in (entry.elts if hasattr(entry, "elts") else [entry])}
    assert unread == {"MambaForCausalLM", "FalconMambaForCausalLM", "InklingForConditionalGeneration",
                      "InklingForConditionalGenerationMTP"}
    assert set(answer["archs"]) | unread == _names("sglang", "0.5.23")
    assert not set(answer["archs"]) & unread


def test_every_draft_class_a_family_rule_names_is_registered_by_that_engine_version():
    from ckptinspect.readiness.loader import load_rules

    missing = [(fam.id, name, rule.version, rule.draft_architecture)
               for fam in load_rules(()).families for name, rule in fam.engines.items()
               if rule.draft_architecture is not None and registry(name, rule.version) is not None
               and rule.draft_architecture not in _names(name, rule.version)]
    assert missing == []


# --- what report and plan make of it -------------------------------------------------------------------

def _plan(path: Path, *args: str) -> subprocess.CompletedProcess:
    """`ckptinspect plan` (the unknown-architecture fixtures have no max_position_embeddings: --context);
    stdout with the renderer's line wrapping undone, one note per line."""
    res = subprocess.run([sys.executable, "-m", "ckptinspect", "plan", str(path), "--gpu", "8xh200", "--context",
                          "4096", *args], capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    lines: list[str] = []
    for line in res.stdout.splitlines():
        if line.startswith("    ") and lines and lines[-1].startswith("  ["):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return subprocess.CompletedProcess(res.args, res.returncode, "\n".join(lines), res.stderr)


def test_plan_prints_no_command_for_an_engine_without_a_model_class(make_fixture):
    path = make_fixture("mistral_large4")
    res = _plan(path)
    assert res.returncode == 0, res.stderr
    assert "python -m sglang.launch_server" not in res.stdout and "vllm serve" in res.stdout
    note = next(ln for ln in res.stdout.splitlines() if "sglang: no launch command" in ln)
    assert "sglang 0.5.23 registers no model class for MistralLarge4ForCausalLM" in note
    assert note.endswith("]") and "rules/engines/architectures.yaml sglang 0.5.23" in note
    # one truth: the report's verdict and finding say the same for SGLang
    r = build_report(str(path), progress=False)
    assert r.mtp.verdicts["sglang"].reasons == (ARCH_UNKNOWN,)
    assert [f.code for f in r.mtp.findings if f.engine == "sglang"] == [ARCH_UNKNOWN]


def test_plan_for_only_that_engine_is_a_failure_that_names_the_other(make_fixture):
    res = _plan(make_fixture("mistral_large4"), "--engine", "sglang")
    assert "registers no model class for MistralLarge4ForCausalLM" in res.stdout + res.stderr
    assert "python -m sglang.launch_server" not in res.stdout
    assert "try --engine vllm" in res.stdout + res.stderr


def test_an_engine_rename_is_followed_before_the_registry_is_asked(make_fixture):
    """SGLang's DeepseekV41Config renames DeepseekV41ForCausalLM to DeepseekV4ForCausalLM (not registered
    under its own name): the target loads, so no arch finding and the draft answer stands."""
    assert "DeepseekV41ForCausalLM" not in _names("sglang", "0.5.23")
    r = build_report(str(make_fixture("deepseek_v41")), progress=False)
    support = arch_support("sglang", "0.5.23", r.checkpoint.config)
    assert (support.status, support.served_as) == ("registered", "DeepseekV4ForCausalLM")
    assert ARCH_UNKNOWN not in r.mtp.verdicts["sglang"].reasons


def test_an_auto_map_lets_the_transformers_backend_take_it(make_fixture, tmp_path):
    """An architecture SGLang does not register, with an auto_map AutoModel: SGLang serves it through its
    Transformers backend (SG:model_loader/utils.py resolve_transformers_arch), so the plan keeps the command."""
    path = tmp_path / "acme"
    shutil.copytree(make_fixture("unknown_model_mtp"), path)
    config = json.loads((path / "config.json").read_text())
    assert arch_support("sglang", "0.5.23", build_report(str(path), progress=False).checkpoint.config).status == "refused"
    config["auto_map"] = {"AutoConfig": "acme.AcmeConfig", "AutoModelForCausalLM": "acme.AcmeForCausalLM"}
    (path / "config.json").write_text(json.dumps(config))
    r = build_report(str(path), progress=False)
    support = arch_support("sglang", "0.5.23", r.checkpoint.config)
    assert support.status == "transformers" and "auto_map" in support.message
    assert ARCH_UNKNOWN not in r.mtp.verdicts["sglang"].reasons
    res = _plan(path)
    assert "python -m sglang.launch_server" in res.stdout and "Transformers backend" in res.stdout


def test_vllm_with_a_transformers_range_is_not_decided_and_says_so(make_fixture):
    """vLLM allows a range of transformers releases: an unregistered architecture is not refused, and the
    plan says the fallback is not decided."""
    r = build_report(str(make_fixture("unknown_model_mtp")), progress=False)
    support = arch_support("vllm", "0.34.0", r.checkpoint.config)
    assert support.status == "undecided" and "not decided here" in support.message
    assert ARCH_UNKNOWN not in r.mtp.verdicts["vllm"].reasons
    res = _plan(make_fixture("unknown_model_mtp"))
    assert "vllm serve" in res.stdout
    assert any("[warning] vllm:" in ln and "not decided" in ln for ln in res.stdout.splitlines())
