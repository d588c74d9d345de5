"""The rules checked against the engines' own dry-load (issue 31 item 3): every corpus entry is read by
`report` (the rules, judged for the installed engine versions, vLLM 0.32.0 and SGLang 0.5.23) and
dry-loaded through each engine's own code (`verify_many`, one engine process per engine for the whole
corpus, with the speculative method the rules give for that engine); wherever the dry-load runs, both must
say the same:

- the per-engine verdict: ``ready`` / ``degraded`` (the draft loads as stored) exactly when the dry-load's
  outcome is ``loads``; ``unusable`` / ``absent`` exactly when it is ``load failed`` or ``defects``;
- the per-module table: a module the rules say the engine builds unquantized is loaded into a parameter of
  a float dtype, and a module the rules say it builds quantized into a parameter holding codes.

The corpus is real released metadata at real dimensions (block-FP8 and NVFP4 scale tiles need them; the
tiny fixtures' dimensions are not multiples of 128 and the engines refuse them for that reason alone):
the released checkpoints of fixtures/data/corpus (>= 40 config.json / hf_quant_config.json, sources in its
SOURCES.md) written by fixtures/corpus.py as sparse header-only replicas (real layer count, 8 routed
experts), plus 4-layer copies of deepseek-ai/DeepSeek-V3, nvidia/Qwen3.5-397B-A17B-NVFP4 and
nvidia/DeepSeek-V3.1-NVFP4 with defects written in (no MTP tensors; a routed MTP expert stored BF16; one MTP
expert scale missing). The count that ran and the count that could not (grouped by why) is printed in the
test log and kept in docs/verify.md (test_docs_table_is_current). Known disagreements are strict xfails
with the engine's code cited (KNOWN_DISAGREEMENTS).
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALLED = {"vllm": "0.32.0", "sglang": "0.5.23"}  # the engine test environments (tests/vllm_engine.py,
# tests/sglang_parser.py)
FLOAT = {"bfloat16", "float16", "float32"}


def _engine_python() -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    from vllm_engine import engine_python

    return engine_python()


def _write(tmp: Path, name: str, config: dict, tensors, extra: dict | None = None) -> Path:
    from fixtures.spec import dump_json, place
    from fixtures.writer import write_sparse_checkpoint

    write_sparse_checkpoint(tmp / name, dump_json(config), place(tensors, 3), extra_files=extra)
    return tmp / name


def _deepseek_v3(tmp: Path, name: str, mutate=None) -> Path:
    from fixtures.replica import replica_tensors
    from fixtures.spec import load_reference

    config = load_reference("deepseek-ai__DeepSeek-V3__config.json")
    config.update(num_hidden_layers=4, n_routed_experts=8, num_experts_per_tok=8)
    tensors = replica_tensors(config)
    return _write(tmp, name, config, mutate(tensors) if mutate else tensors)


def _qwen35_nvfp4(tmp: Path, name: str, mutate=None) -> Path:
    from fixtures.replica import replica_tensors
    from fixtures.spec import DATA_DIR, load_reference

    config = load_reference("nvidia__Qwen3.5-397B-A17B-NVFP4__config.json")
    text = config["text_config"]
    text.update(num_hidden_layers=4, layer_types=text["layer_types"][:4], num_experts=8, num_experts_per_tok=8)
    tensors = replica_tensors(config)
    quant = (DATA_DIR / "nvidia__Qwen3.5-397B-A17B-NVFP4__hf_quant_config.json").read_text(encoding="utf-8")
    return _write(tmp, name, config, mutate(tensors) if mutate else tensors, {"hf_quant_config.json": quant})


def _deepseek_v31_nvfp4(tmp: Path, name: str) -> Path:
    """nvidia/DeepSeek-V3.1-NVFP4's layout (fixtures.families_deepseek._v3_nvfp4) at its real dimensions."""
    import fixtures.families_deepseek as ds

    real = {"num_hidden_layers": 4, "first_k_dense_replace": 3, "n_routed_experts": 8, "num_experts_per_tok": 8}
    saved, ds.TINY_DS = ds.TINY_DS, real  # the fixture recipe, with real dimensions instead of tiny ones
    try:
        spec = ds._v3_nvfp4(name)
    finally:
        ds.TINY_DS = saved
    extra = {file: text for file, text in spec.files}
    return _write(tmp, name, spec.config, list(spec.tensors), extra)


def _no_mtp(tensors):
    return [t for t in tensors if not t.mtp]


def _bf16_mtp_expert(tensors):
    return [replace(t, dtype="BF16") if t.mtp and t.name.endswith("experts.5.down_proj.weight") else t for t in tensors]


def _mtp_scale_missing(tensors):
    return [t for t in tensors if not (t.mtp and t.name.endswith("experts.2.up_proj.weight_scale_inv"))]


def _real(entry):
    from fixtures.corpus import write_entry

    return lambda tmp: write_entry(entry, tmp)


def _real_corpus() -> dict:
    from fixtures.corpus import entries

    return {e.repo: _real(e) for e in entries()}


CORPUS = {
    "deepseek-v3-fp8": lambda tmp: _deepseek_v3(tmp, "deepseek-v3-fp8"),
    "deepseek-v3-fp8-no-mtp": lambda tmp: _deepseek_v3(tmp, "deepseek-v3-fp8-no-mtp", _no_mtp),
    "deepseek-v3-fp8-bf16-mtp-expert": lambda tmp: _deepseek_v3(tmp, "deepseek-v3-fp8-bf16-mtp-expert", _bf16_mtp_expert),
    "deepseek-v3-fp8-mtp-scale-missing": lambda tmp: _deepseek_v3(tmp, "deepseek-v3-fp8-mtp-scale-missing",
                                                                   _mtp_scale_missing),
    "qwen3.5-397b-nvfp4": lambda tmp: _qwen35_nvfp4(tmp, "qwen3.5-397b-nvfp4"),
    "qwen3.5-397b-nvfp4-no-mtp": lambda tmp: _qwen35_nvfp4(tmp, "qwen3.5-397b-nvfp4-no-mtp", _no_mtp),
    "deepseek-v3.1-nvfp4": lambda tmp: _deepseek_v31_nvfp4(tmp, "deepseek-v3.1-nvfp4"),
    **_real_corpus(),  # fixtures/data/corpus: one entry per released checkpoint ("org/name")
}
# Disagreements found by this test and not yet fixed in the rules: entry -> what differs (xfail strict,
# so the test flips when the rules are fixed).
KNOWN_DISAGREEMENTS: dict[tuple[str, str], str] = {}
# The module table's disagreements (test_module_table_equals_the_dry_load), in the same form; none open since
# the MTP o_proj of MiMo-V2 (vLLM builds it unquantized: rules/families/mimo_v2.yaml) was fixed.
KNOWN_MODULE_DISAGREEMENTS: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """engine -> entry -> (report judged for the installed engine version, that engine's dry-load)."""
    from ckptinspect.pipeline import build_report
    from ckptinspect.verify import verify_many
    from tests.test_verify import sglang_environment

    tmp = tmp_path_factory.mktemp("corpus")
    refs = {name: str(build(tmp)) for name, build in CORPUS.items()}
    sglang_python, sglang_path = sglang_environment()
    runs = {"vllm": dict(engine_python=_engine_python()),
            "sglang": dict(engine_python=sglang_python, engine_pythonpath=sglang_path)}
    out: dict = {}
    reports = {name: build_report(ref, progress=False, engine_versions=dict(INSTALLED)) for name, ref in refs.items()}
    for engine, options in runs.items():
        # the dry-load runs the speculative method the rules give for the engine (their flags' method)
        methods = [reports[name].mtp.verdicts[engine].method for name in refs]
        os.environ["CKPTINSPECT_VERIFY_STUB_MISSING"] = "torchvision"
        start = time.perf_counter()
        try:
            results = verify_many(list(refs.values()), engine, deadline=1500, methods=methods, **options)
        finally:
            os.environ.pop("CKPTINSPECT_VERIFY_STUB_MISSING", None)
        seconds = time.perf_counter() - start
        out[engine] = {name: (reports[name], result) for name, result in zip(refs, results)}
        SECONDS[engine] = seconds
        print("\n" + summary_text(engine, {n: r for n, (_, r) in out[engine].items()}, seconds))
    return out


SECONDS: dict[str, float] = {}


# A dry-load that stops before the engine looked at the checkpoint's MTP for a reason that is neither the
# checkpoint's nor the machine's: it could not run here. Matched on the failing step's error.
CANNOT_RUN = (
    (r"contains custom code which must be executed|Transformers does not recognize this architecture",
     "the config needs the checkpoint's own modeling code (auto_map / trust_remote_code), which a metadata-only "
     "replica does not carry"),
)


def not_run_reason(result) -> str | None:
    """None when the dry-load ran (its outcome is loads / defects / load failed); else why it could not,
    as a reason shared by every entry it stops the same way."""
    import re

    if isinstance(result, str):
        return f"checkpoint unreadable: {result}"
    if result.outcome == "load failed":
        errors = " ".join(s.error or "" for s in result.steps if not s.ok)
        return next((why for pattern, why in CANNOT_RUN if re.search(pattern, errors)), None)
    if result.outcome != "not run":
        return None
    failed = [s for s in result.steps if not s.ok]
    if not failed:
        return "the engine stopped before loading (no failed step)"
    step = failed[0]
    import re

    error = (step.error or "").split("\n")[0]
    error = error if len(error) <= 160 else error[:157] + "..."
    if len(error.split(":", 1)[-1].strip()) < 8 and getattr(step, "where", None):  # a bare assert: say where
        where = re.sub(r"^.*/(sglang|vllm)/", r"\1/", step.where)
        error += f" (in {where})"
    kind = "the engine refuses the CPU platform" if step.platform else "the engine stops"
    return f"{kind} at {step.step!r}: {error}"


def tally(results: dict) -> tuple[list[str], dict[str, list[str]]]:
    """(entries that ran, reason -> entries that could not run) for one engine."""
    ran, why = [], {}
    for name, result in results.items():
        reason = not_run_reason(result)
        if reason is None:
            ran.append(name)
        else:
            why.setdefault(reason, []).append(name)
    return ran, why


def summary_text(engine: str, results: dict, seconds: float | None = None) -> str:
    ran, why = tally(results)
    real = [n for n in results if "/" in n]
    real_ran = [n for n in ran if "/" in n]
    head = (f"rules vs dry-load ({engine} {INSTALLED[engine]}, one engine process"
            + (f", {seconds:.1f} s" if seconds is not None else "") + f"): {len(ran)} of {len(results)} entries "
            f"dry-loaded ({len(real_ran)} of {len(real)} released checkpoints), {len(results) - len(ran)} could not run")
    lines = [head]
    for reason, names in sorted(why.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"  could not run ({len(names)}): {reason}")
        lines += [f"    {n}" for n in sorted(names)]
    return "\n".join(lines)


def _dryload_verdict(result) -> str:
    """Only ``loads`` is a draft that loads as stored: a ``target copy`` loads the trunk into a second copy
    of the target model, which is no MTP head (verify/decide.py AGREEING: unusable / absent)."""
    return "loads" if result.outcome == "loads" else "fails"


def _rules_verdict(report, engine: str) -> str:
    """``absent`` (the checkpoint stores no MTP head) is a draft that cannot load as stored: the engine
    either refuses the method for the architecture or builds a draft nothing is loaded into."""
    verdict = report.mtp.verdicts[engine].verdict
    return {"ready": "loads", "degraded": "loads", "unusable": "fails", "absent": "fails"}.get(verdict, verdict)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_verdict_equals_the_dry_load(corpus, engine, name, request):
    if (engine, name) in KNOWN_DISAGREEMENTS:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_DISAGREEMENTS[engine, name], strict=True))
    report, result = corpus[engine][name]
    assert not isinstance(result, str), result
    if not_run_reason(result) is not None:
        pytest.skip(f"the dry-load could not run: {not_run_reason(result)}")
    assert result.engine_version == INSTALLED[engine]
    detail = {"rules": (report.mtp.verdicts[engine].verdict, report.mtp.verdicts[engine].reasons),
              "dry-load": (result.outcome, [s.error for s in result.steps if not s.ok],
                           [(m.module, p.name, p.problems) for m in result.modules for p in m.parameters
                            if p.status in ("mismatch", "never loaded")], result.mtp_tensors_skipped[:5])}
    assert _rules_verdict(report, engine) == _dryload_verdict(result), json.dumps(detail, default=str, indent=1)


@pytest.mark.parametrize("name", ["MiniMaxAI/MiniMax-M2.5", "MiniMaxAI/MiniMax-M2.7"])
def test_minimax_m2_draft_per_engine(corpus, name):
    """No MTP tensor ships (num_mtp_modules 3 declared). SGLang 0.5.23 has no M2 draft class
    (configs/model_config.py:1010-1211 _config_draft_model renames no MiniMaxM2ForCausalLM): NEXTN builds the
    target's own class as the draft and loads the trunk into it, a target copy (and its EAGLE worker would
    then call set_embed_and_head, which the class lacks: speculative/eagle_worker_v2.py:378). vLLM 0.32.0
    refuses method mtp for it (vllm/config/speculative.py:1386-1389). Both agree with the rules' unusable, each
    for its own reason, and the report's SGLang reason says the engine would build the target as draft."""
    report, sglang = corpus["sglang"][name]
    assert (sglang.outcome, sglang.draft_class, sglang.target_architectures, sglang.mtp_tensors_loaded) == (
        "target copy", "MiniMaxM2ForCausalLM", ("MiniMaxM2ForCausalLM",), 0)
    assert len(sglang.other_tensors_loaded) > 0  # the trunk went into the draft: a second copy of the weights
    assert any("set_embed_and_head" in line and "eagle_worker_v2.py" in line for line in sglang.not_run)
    _, vllm = corpus["vllm"][name]
    assert vllm.outcome == "load failed"
    assert any("Unsupported speculative method" in (s.error or "") for s in vllm.steps if not s.ok)
    for engine in ("sglang", "vllm"):
        assert report.mtp.verdicts[engine].verdict == "unusable"
    message = next(f.message for f in report.mtp.findings if f.engine == "sglang"
                   and f.code == "mtp-declared-not-published")
    assert "build the target model itself (MiniMaxM2ForCausalLM) as the draft" in message


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_module_table_equals_the_dry_load(corpus, engine, name, request):
    if (engine, name) in KNOWN_MODULE_DISAGREEMENTS:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_MODULE_DISAGREEMENTS[engine, name], strict=True))
    report, result = corpus[engine][name]
    if isinstance(result, str) or not_run_reason(result) is not None or result.outcome == "load failed":
        pytest.skip("no module was loaded by the engine")
    dtypes = {f"{m.module}.{p.name}": p.dtype for m in result.modules for p in m.parameters}
    targets = dict(result.mtp_tensor_targets)
    compared, wrong = 0, []
    for row in report.mtp.modules:
        built = row.built.get(engine)
        if built in (None, "load error", "no draft model"):
            continue
        pattern = row.module.replace("{}", "*") + ".weight"
        params = {p for tensor, ps in targets.items() if fnmatch.fnmatchcase(tensor, pattern) for p in ps}
        weights = {p for p in params if p.rsplit(".", 1)[-1].endswith("weight")}
        if not weights and row.module + ".weight" in result.mtp_tensors_skipped \
                and any(p.status == "shared" for m in result.modules for p in m.parameters):
            continue  # the engine skips the stored copy and uses the target's (shared_head.head in SGLang)
        if not weights:
            wrong.append(f"{row.module}: rules say {engine} builds it {built}; {engine} loaded no weight of it")
            continue
        engine_float = all(dtypes[p] in FLOAT for p in weights)
        if engine_float != (built == "unquantized"):
            wrong.append(f"{row.module}: rules say {built}; {engine} built {sorted(dtypes[p] for p in weights)}")
        compared += 1
    if not report.mtp.modules:
        pytest.skip("the checkpoint ships no MTP module to compare")
    assert compared > 0
    assert wrong == []


DOC = ROOT / "docs" / "verify.md"
DOC_START, DOC_END = "<!-- corpus-table:start (tests/test_verify_vs_rules.py) -->", "<!-- corpus-table:end -->"


def corpus_table(results: dict) -> str:
    """The docs' table: the released-checkpoint corpus per family, and per engine the count that ran and
    the count that could not (grouped by why). ``results``: engine -> entry -> dry-load result."""
    from fixtures.corpus import entries

    real = entries()
    families: dict[str, list[str]] = {}
    for e in real:
        families.setdefault(e.family, []).append(e.repo)
    lines = [f"Released checkpoints in the corpus: {len(real)} (fixtures/data/corpus, sources in its SOURCES.md), "
             f"plus {len(CORPUS) - len(real)} defect copies.", "", "| Family | Checkpoints |", "|---|---|"]
    lines += [f"| `{f}` | {len(names)}: {', '.join(sorted(names))} |" for f, names in sorted(families.items())]
    lines += ["", "| Engine | Dry-loaded | Could not run | Why (count) |", "|---|---|---|---|"]
    for engine in ("sglang", "vllm"):
        ran, why = tally(results[engine])
        reasons = "<br>".join(f"{reason.replace('|', '/')} ({len(names)}: {', '.join(sorted(names))})"
                              for reason, names in sorted(why.items(), key=lambda kv: (-len(kv[1]), kv[0])))
        lines.append(f"| {engine} {INSTALLED[engine]} | {len(ran)} of {len(results[engine])} | "
                     f"{len(results[engine]) - len(ran)} | {reasons or '-'} |")
    disagreements = sorted(set(KNOWN_DISAGREEMENTS) | set(KNOWN_MODULE_DISAGREEMENTS))
    listed = ", ".join(f"{e} `{n}`" for e, n in disagreements) if disagreements else "none"
    lines += ["", f"Open disagreements (strict xfail, engine code cited in KNOWN_DISAGREEMENTS): {len(disagreements)}: "
              f"{listed}."]
    return "\n".join(lines)


def test_docs_table_is_current(corpus):
    """docs/verify.md carries the table this run produces; CKPTINSPECT_UPDATE_DOCS=1 rewrites it."""
    table = corpus_table({engine: {n: r for n, (_, r) in per.items()} for engine, per in corpus.items()})
    text = DOC.read_text(encoding="utf-8")
    head, _, rest = text.partition(DOC_START)
    _, _, tail = rest.partition(DOC_END)
    fresh = f"{head}{DOC_START}\n{table}\n{DOC_END}{tail}"
    if os.environ.get("CKPTINSPECT_UPDATE_DOCS") == "1":
        DOC.write_text(fresh, encoding="utf-8")
    assert DOC_START in text and DOC_END in text, f"{DOC} lacks the corpus-table markers"
    assert fresh == text, "docs/verify.md's corpus table is stale: rerun with CKPTINSPECT_UPDATE_DOCS=1"


def test_every_corpus_file_has_its_source():
    """fixtures/data/corpus/SOURCES.md names each corpus file's repository, path and commit."""
    from fixtures.corpus import CORPUS_DIR, entries

    sources = (CORPUS_DIR / "SOURCES.md").read_text(encoding="utf-8")
    files = sorted(p.name for p in CORPUS_DIR.glob("*.json"))
    assert len(entries()) >= 40
    missing = [f for f in files if not any(line.startswith(f"| `{f}` |") and line.count("`") >= 6
                                           for line in sources.splitlines())]
    assert missing == []
