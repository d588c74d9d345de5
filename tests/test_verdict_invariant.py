"""No engine verdict is milder than an error finding about that engine's MTP tensors.

Checked over every fixture the project generates (``fixtures.generate.FIXTURES``, so fixtures added
later are covered too) and, property-style, over generated MTP storage formats x MTP exclude entries
on two real NVFP4 layouts (Qwen3.5 ``mtp.``, DeepSeek ``model.layers.{L}``), where a slow reference
(fnmatch over the exclude entries, module by module) also predicts each engine's verdict and what
it builds per module.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptinspect.errors import CkptInspectError
from ckptinspect.pipeline import Report, build_report
from ckptinspect.records import VERDICT_RANK
from fixtures import generate
from fixtures.broken import broken_fixtures
from fixtures.failure_modes import deepseek_mtp_variant, qwen_mtp_variant
from fixtures.families_misc import llama_bf16

BROKEN = {s.name for s in broken_fixtures(llama_bf16("llama_base", 2))}


def _mtp_names(report: Report) -> list[str]:
    return [n for g in report.checkpoint.inventory.groups if g.mtp_layer is not None for n in g.names()]


def concerns_mtp(subject: str | None, names: list[str]) -> bool:
    """Independent of readiness' own test: the subject is an MTP tensor, a module or prefix of one,
    or an ``N``-masked pattern matching one."""
    if not subject:
        return False
    prefix = subject if subject.endswith(".") else subject + "."
    pattern = re.compile(re.escape(subject).replace(r"\.N\.", r"\.\d+\.") + r"(\..*)?$")
    return any(n == subject or n.startswith(prefix) or pattern.match(n) for n in names)


def violations(report: Report) -> list[str]:
    """(engine, verdict, finding) triples breaking the invariant."""
    mtp = report.mtp
    names = _mtp_names(report)
    out = []
    for finding in (*report.checkpoint.findings, *mtp.findings):
        if finding.severity != "error":
            continue
        if finding.engine is None and not concerns_mtp(finding.subject, names):
            continue
        for engine, verdict in mtp.verdicts.items():
            if finding.engine not in (None, engine):
                continue
            if VERDICT_RANK[verdict.verdict] < VERDICT_RANK["unusable"]:
                out.append(f"{engine}={verdict.verdict} despite {finding.code} ({finding.subject}): {finding.message}")
    return out


# --- one truth: findings and verdict reasons derive from the per-module table -------------------------

# Error codes that say "the engine builds this module unlike it is stored": each must agree with the
# module table (MTP modules) or with the engine's own decision procedure (trunk modules).
BUILT_UNLIKE_STORED = {"quantized-but-excluded", "mtp-bf16-not-excluded", "mtp-partial-quant",
                       "mtp-quantized-but-built-unquantized", "mtp-plain-linear-quantized"}
# Findings that say the engines build modules as stored (the lists they name are not read for them).
BUILT_AS_STORED = {"excluded-entry-not-read", "fp8-ignore-read-for-experts-only"}


def _row_for(report: Report, subject: str):
    """The module-table row whose module (``{}`` = any number) is the subject or the subject's module."""
    for row in report.mtp.modules:
        regex = re.compile("^" + re.escape(row.module).replace(r"\{\}", r"\d+") + r"(\.[a-z_0-9]+)?$")
        if regex.match(subject):
            return row
    return None


def _trunk_builds_quantized(report: Report, engine: str, module: str) -> bool | None:
    """The engine's own procedure (rules/quant/<engine>.yaml) for a trunk module; None: not modelled."""
    from ckptinspect.quant.engine_decision import QUANTIZED, UNKNOWN, decide
    from ckptinspect.readiness import load_rules
    from ckptinspect.readiness.draft_build import rule_at
    from ckptinspect.readiness.module_quant import module_quant_rules
    from ckptinspect.readiness.quant_method import engine_method

    family = load_rules().get(report.mtp.family) if report.mtp.family else None
    if family is None or engine not in family.engines:
        return None
    section = module_quant_rules(engine)
    entry = rule_at(section, engine_method(report.checkpoint.declared), family.engines[engine].version)
    if entry is None:
        return None
    kind = "moe" if ".experts." in module else "linear"
    asked = module[:module.index(".experts.") + len(".experts")] if kind == "moe" else module
    built = decide(section, entry, report.checkpoint.declared, asked, kind).built
    return None if built == UNKNOWN else built == QUANTIZED


def one_truth_violations(report: Report) -> list[str]:
    """Findings or verdict reasons that contradict the per-module table / the engines' own decisions, a
    "built as stored" finding next to a "built unlike stored" error for the same engine, and empty cells."""
    out = []
    engines = tuple(report.mtp.verdicts)
    for row in report.mtp.modules:  # "not decided" is a state with a name, never an empty cell
        for engine in engines:
            if not row.built.get(engine):
                out.append(f"{row.module}: empty {engine} cell")
    findings = (*report.checkpoint.findings, *report.mtp.findings)
    for f in findings:
        if f.severity != "error" or f.code not in BUILT_UNLIKE_STORED or not f.subject:
            continue
        scope = (f.engine,) if f.engine else engines
        row = _row_for(report, f.subject)
        for engine in scope:
            if row is not None:
                if row.matches.get(engine) and engine in report.mtp.verdicts and f.code != "quantized-but-excluded":
                    out.append(f"{f.code} [{engine}] on {f.subject}, but the table says {engine} builds "
                               f"{row.module} as stored ({row.built[engine]})")
                elif f.code == "quantized-but-excluded" and row.matches.get(engine):
                    out.append(f"{f.code} [{engine}] on {f.subject}, but the table says it is built as stored")
            elif f.code == "quantized-but-excluded" and _trunk_builds_quantized(report, engine, f.subject):
                out.append(f"{f.code} [{engine}] on {f.subject}, but {engine}'s own procedure builds it quantized")
    # every verdict reason from a defect over stored facts names the per-module facts it rests on
    from ckptinspect.readiness import load_rules
    from ckptinspect.readiness.loader import STORED_ONLY, _condition_keys

    family = load_rules().get(report.mtp.family) if report.mtp.family else None
    for engine, verdict in report.mtp.verdicts.items():
        rule = family.engines.get(engine) if family is not None else None
        for reason in verdict.reasons:
            defect = next((d for d in (rule.defects if rule else ()) if d.code == reason), None)
            if defect is not None and _condition_keys(defect.when) & STORED_ONLY and not defect.per_module_facts:
                out.append(f"{engine} reason {reason} rests on stored facts only")
    # no finding says an engine builds modules as stored while an error says the same engine does not
    as_stored = {key.strip() for f in findings if f.code == "excluded-entry-not-read"
                 for key in f.message.rsplit("Patterns: ", 1)[-1].split(",")}
    for f in findings:
        key = f.message.split(":", 1)[0]
        if f.severity == "error" and f.code == "quantized-but-excluded" and f.engine is None and key in as_stored:
            out.append(f"{f.code} on {f.subject} for every engine next to excluded-entry-not-read for {key}")
    ignore_warn = [f for f in findings if f.code == "fp8-ignore-not-read"]
    if ignore_warn:
        raw = report.checkpoint.declared.raw if isinstance(report.checkpoint.declared.raw, dict) else {}
        listed = [p for p in raw.get("ignore") or () if isinstance(p, str)]
        for f in findings:
            if f.severity == "error" and f.code == "quantized-but-excluded" and f.subject and any(
                    fnmatch.fnmatchcase(f.subject, p) or fnmatch.fnmatchcase(f.subject, p + ".*") for p in listed):
                out.append(f"{f.code} on {f.subject} (named by `ignore`) contradicts fp8-ignore-not-read")
    return out


@pytest.mark.parametrize("name", sorted(generate.FIXTURES))
def test_no_finding_or_reason_contradicts_the_module_table(make_fixture, name):
    path = make_fixture(name)
    try:
        report = build_report(str(path), progress=False)
    except CkptInspectError:
        assert name in BROKEN
        return
    assert one_truth_violations(report) == []


def test_one_truth_checker_bites_on_the_issue_report(make_fixture):
    """Not vacuous: the DeepSeek-V4 NVFP4 release's report as it was (the crosscheck's generic errors
    restored, with the fp8 ignore warning) is flagged, and a forged empty cell is too."""
    from dataclasses import replace

    from ckptinspect.records import Finding

    report = build_report(str(make_fixture("deepseek_v4_nvidia_nvfp4")), progress=False)
    assert one_truth_violations(report) == []
    forged = (*report.checkpoint.findings,
              Finding("quantized-but-excluded", "error", "mtp.N.attn.wq_a: 1 module(s) stored quantized but listed "
                      "as excluded", subject="mtp.0.attn.wq_a"),
              Finding("quantized-but-excluded", "error", "layers.N.attn.wkv: 4 module(s) stored quantized but listed "
                      "as excluded", subject="layers.0.attn.wkv"),
              Finding("fp8-ignore-not-read", "warning", "ignore not read", subject="config.json:quantization_config.ignore"))
    broken = replace(report, checkpoint=replace(report.checkpoint, findings=forged))
    problems = one_truth_violations(broken)
    assert any("table says it is built as stored" in p for p in problems)
    assert any("contradicts fp8-ignore-not-read" in p for p in problems)
    assert any("for every engine next to excluded-entry-not-read for layers.N.attn.wkv" in p for p in problems)
    assert any("layers.0.attn.wkv" in p and "own procedure builds it quantized" in p for p in problems)
    row = replace(report.mtp.modules[0], built={**report.mtp.modules[0].built, "vllm": ""})
    empty = replace(report, mtp=replace(report.mtp, modules=(row, *report.mtp.modules[1:])))
    assert any("empty vllm cell" in p for p in one_truth_violations(empty))


def test_every_family_defect_over_stored_facts_names_its_per_module_facts():
    """The schema field, checked over every shipped rule (readiness/loader.py refuses a file without it)."""
    from ckptinspect.readiness import load_rules
    from ckptinspect.readiness.loader import STORED_ONLY, _condition_keys, per_module_problem

    rules = load_rules()
    checked = 0
    for family in rules.families:
        for engine in family.engines.values():
            for d in engine.defects:
                if _condition_keys(d.when) & STORED_ONLY:
                    checked += 1
                    assert d.per_module_facts and all(f in d.when for f in d.per_module_facts), (family.id, d.code)
    assert checked >= 10
    assert per_module_problem({"code": "x", "when": {"partial_quant_in_mtp": True}, "verdict": "unusable"})
    assert per_module_problem({"code": "x", "when": {"mtp_scheme_is": ["nvfp4"]},
                               "per_module_facts": ["mtp_built_scheme_is"]})
    assert not per_module_problem({"code": "x", "when": {"mtp_scheme_is": ["nvfp4"], "mtp_built_scheme_is": ["nvfp4"]},
                                   "per_module_facts": ["mtp_built_scheme_is"]})


@pytest.mark.parametrize("name", sorted(generate.FIXTURES))
def test_no_verdict_milder_than_an_mtp_error(make_fixture, name):
    path = make_fixture(name)
    try:
        report = build_report(str(path), progress=False)
    except CkptInspectError as exc:
        # only the deliberately broken fixtures (fixtures/broken.py) may fail, with the one-line error
        assert name in BROKEN, f"{name}: {exc}"
        assert "\n" not in str(exc)
        return
    assert violations(report) == []


def test_invariant_bites_on_the_issue_case(make_fixture):
    """The issue's checkpoint: MTP experts NVFP4 although the lists exclude mtp*. The cross-check's
    error concerns the MTP tensors; both engines are unusable for their own per-module reason, not
    only through the catch-all rule."""
    report = build_report(str(make_fixture("qwen3_5_moe_mtp_quantized_but_excluded")), progress=False)
    errors = [f for f in report.checkpoint.findings if f.code == "quantized-but-excluded"]
    assert errors and all(concerns_mtp(f.subject, _mtp_names(report)) for f in errors)
    vl, sg = report.mtp.verdicts["vllm"], report.mtp.verdicts["sglang"]
    assert vl.verdict == sg.verdict == "unusable"
    assert "mtp-quantized-but-excluded" in vl.reasons  # per module: excluded -> BF16 parameters
    assert "mtp-quantized-4bit" not in vl.reasons  # nothing is built NVFP4
    assert vl.draft_quantization is None
    assert "mtp-quantized-but-built-unquantized" in sg.reasons  # the whole draft is BF16 under modelopt_fp4
    built = dict(vl.module_quantization)
    assert built["mtp.layers.0.mlp.experts.{}.gate_proj"] is None
    assert violations(report) == []


def test_invariant_checker_detects_a_mild_verdict(make_fixture):
    """The checker is not vacuous: the issue's report with the vLLM verdict forced back to degraded fails it."""
    from dataclasses import replace

    report = build_report(str(make_fixture("qwen3_5_moe_mtp_quantized_but_excluded")), progress=False)
    verdicts = dict(report.mtp.verdicts)
    verdicts["vllm"] = replace(verdicts["vllm"], verdict="degraded")
    broken = replace(report, mtp=replace(report.mtp, verdicts=verdicts))
    assert violations(broken) and all(v.startswith("vllm=degraded") for v in violations(broken))


# --- property: generated MTP formats x exclude entries, against a slow per-module reference -------

QWEN_MODULES = {  # relative module group -> fnmatch of its module names
    "fc": "mtp.fc", "attention": "mtp.layers.0.self_attn.*", "experts": "mtp.layers.0.mlp.experts.*",
    "shared": "mtp.layers.0.mlp.shared_expert.*"}
QWEN_ENTRIES = ("mtp*", "mtp.layers.0*", "mtp.fc", "mtp.layers.0.self_attn*", "mtp.layers.0.mlp.experts*",
                "mtp.layers.0.mlp.shared_expert*", "mtp.layers.0.mlp.experts.0*")
DS_MODULES = {"eh_proj": "model.layers.3.eh_proj", "attention": "model.layers.3.self_attn.*",
              "experts": "model.layers.3.mlp.experts.*", "shared": "model.layers.3.mlp.shared_experts.*"}
DS_ENTRIES = ("model.layers.3*", "model.layers.3.eh_proj", "model.layers.3.self_attn*",
              "model.layers.3.mlp.experts*", "model.layers.3.mlp.shared_experts*", "model.layers.3.mlp.experts.1*")
# Modules both engines build as a plain Linear whatever the lists say (rules/families/_mtp_common.yaml,
# qwen3_5_moe.yaml: vLLM >= 0.33 forces mtp.fc to BF16 under modelopt_fp4).
PLAIN = {"qwen": {"sglang": {"mtp.fc"}, "vllm": {"mtp.fc"}},
         "deepseek": {"sglang": {"model.layers.3.eh_proj"}, "vllm": {"model.layers.3.eh_proj"}}}


def _excluded(module: str, entries: tuple[str, ...]) -> bool:
    """ModelOpt exclude_modules: fnmatch on the module name; a listed parent covers its children."""
    return any(fnmatch.fnmatchcase(module, e) or fnmatch.fnmatchcase(module, e + ".*") or module.startswith(e + ".")
               for e in entries)


def reference(layout: str, report: Report) -> dict[str, tuple[str, bool]]:
    """Per MTP Linear module (concrete name): (stored scheme, vLLM builds it NVFP4). Exclude entries:
    every entry of the declared ModelOpt lists (both files carry the same list here)."""
    entries = tuple(e for lst in report.checkpoint.declared.excludes for e in lst.entries)
    out = {}
    for g in report.checkpoint.inventory.groups:
        if g.mtp_layer is None or g.role != "weight" or len(g.shape) < 2 or g.component in (
                "norm", "embedding", "lm_head", "router"):
            continue
        for name in g.names():
            module = name.rsplit(".", 1)[0]
            # vLLM asks the routed experts once as their fused MoE (``...mlp.experts``), which an entry
            # naming one expert excludes whole (VL:utils/quant_utils.py is_layer_skipped, experts branch)
            moe = re.sub(r"(\.experts)\.\d+\..*$", r"\1", module)
            whole_moe = moe != module and any("experts" in e and moe in e for e in entries)
            quantized_build = module not in PLAIN[layout]["vllm"] and not _excluded(module, entries) and not whole_moe
            out[module] = (g.scheme, quantized_build)
    return out


@st.composite
def variants(draw):
    layout = draw(st.sampled_from(["qwen", "deepseek"]))
    modules, candidates = (QWEN_MODULES, QWEN_ENTRIES) if layout == "qwen" else (DS_MODULES, DS_ENTRIES)
    formats = tuple((pattern, draw(st.sampled_from(["bf16", "nvfp4"]), label=key)) for key, pattern in modules.items())
    entries = tuple(draw(st.lists(st.sampled_from(candidates), unique=True, max_size=4)))
    return layout, formats, entries


_BUILT: dict[tuple, Report] = {}


def _report(layout: str, formats, entries, root: Path) -> Report:
    key = (layout, formats, entries)
    if key not in _BUILT:
        name = f"prop_{len(_BUILT)}"
        make = qwen_mtp_variant if layout == "qwen" else deepseek_mtp_variant
        spec = make(name, formats, entries)
        generate.FIXTURES[name] = spec
        try:
            path = generate.build_fixture(name, root)
        finally:
            del generate.FIXTURES[name]
        _BUILT[key] = build_report(str(path), progress=False)
    return _BUILT[key]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(variants())
def test_generated_excludes_and_layouts(tmp_path_factory, case):
    layout, formats, entries = case
    report = _report(layout, formats, entries, tmp_path_factory.mktemp("prop", numbered=True))
    assert violations(report) == []
    assert one_truth_violations(report) == []
    ref = reference(layout, report)
    mismatched = [m for m, (scheme, q) in ref.items() if (scheme == "nvfp4") != q]
    stored_quantized = [m for m, (scheme, _) in ref.items() if scheme == "nvfp4"]
    vl, sg = report.mtp.verdicts["vllm"], report.mtp.verdicts["sglang"]
    # vLLM: the target's modelopt config per module; any module whose stored precision differs from
    # what is built does not load; otherwise NVFP4 modules make a degraded (4-bit) draft
    expected_vllm = "unusable" if mismatched else "degraded" if stored_quantized else "ready"
    assert vl.verdict == expected_vllm, (mismatched, vl.reasons)
    built = {m: b for m, b in vl.module_quantization}
    for module, (_, quantized_build) in ref.items():
        pattern = _group_key(module, built)
        assert (built[pattern] is not None) == quantized_build or _mixed_group(pattern, ref), module
    assert (vl.draft_quantization is not None) == any(q for _, q in ref.values())
    # SGLang's Qwen3.5 / DeepSeek NextN drafts are built unquantized as a whole under modelopt_fp4
    assert sg.verdict == ("unusable" if stored_quantized else "ready"), sg.reasons
    assert sg.draft_quantization is None


def _group_key(module: str, built: dict) -> str:
    for pattern in built:
        regex = "^" + re.escape(pattern).replace(r"\{\}", r"\d+") + "$"
        if re.match(regex, module):
            return pattern
    raise AssertionError(f"{module} has no entry in module_quantization {sorted(built)}")


def _mixed_group(pattern: str, ref: dict) -> bool:
    """A group whose members the reference builds differently (an entry naming one expert): the
    engine side answers for the group from its first/middle/last member, so it is not compared."""
    regex = re.compile("^" + re.escape(pattern).replace(r"\{\}", r"\d+") + "$")
    return len({q for m, (_, q) in ref.items() if regex.match(m)}) > 1


# --- the member shortcut (quant/members.py) against asking every member ----------------------

def _plans(report: Report, exhaustive: bool) -> dict[str, list]:
    from ckptinspect.readiness import load_rules
    from ckptinspect.readiness.assess import _context_at, build_facts
    from ckptinspect.readiness.draft_build import build_plan

    rules = load_rules()
    family = rules.get(report.mtp.family) if report.mtp.family else None
    facts = build_facts(report.checkpoint, family, rules)
    out = {}
    for name, engine in facts.rule.engines.items():
        ctx = _context_at(facts, engine, engine.version)
        out[name] = [(m.module, m.built_quantized, m.built_unquantized, set(m.reasons))
                     for m in build_plan(ctx, exhaustive=exhaustive)]
    return out


@pytest.mark.parametrize("name", sorted(set(generate.FIXTURES) - BROKEN))
def test_member_shortcut_equals_asking_every_member_on_fixtures(make_fixture, name):
    report = build_report(str(make_fixture(name)), progress=False)
    assert _plans(report, exhaustive=False) == _plans(report, exhaustive=True)


_HEADS = ["", "mtp.layers.0.mlp.experts.", "mtp.layers.0.mlp.", "mtp.", "mtp.layers.0.mlp.experts.1", "*", ".*",
          "mtp.layers.0.mlp.experts.?", "model.", "*1", "*experts.2", ".*\\.1"]
_TOKENS = ["*", "?", "1", "2", "0", ".", "gate_proj", "[0-4]", "[!1]", ".*", "\\d", "\\.", "(\\d)\\1", "$",
           "{2}", "+", "experts"]


@settings(max_examples=400, deadline=None)
@given(ids=st.sets(st.integers(0, 320), min_size=2, max_size=40),
       lists=st.lists(st.tuples(st.sampled_from(["modelopt_glob", "glob", "ct_regex", "gptq_dynamic", "include_map"]),
                                st.lists(st.tuples(st.booleans(), st.sampled_from(_HEADS),
                                                   st.lists(st.sampled_from(_TOKENS), max_size=5)), max_size=4)),
                      min_size=1, max_size=3))
def test_member_shortcut_is_exact_on_generated_lists(ids, lists):
    """Members with the same digit counts get the same answer whenever the shortcut skips them."""
    from ckptinspect.quant.declared import ExcludeMatcher
    from ckptinspect.quant.members import module_names, weighted_members
    from ckptinspect.records import DeclaredQuant, ExcludeList, TensorGroup

    excludes = tuple(ExcludeList(f"list{i}", semantics, tuple(("re:" if re_prefix else "") + head + "".join(tokens)
                                                              for re_prefix, head, tokens in entries))
                     for i, (semantics, entries) in enumerate(lists))
    declared = DeclaredQuant("modelopt:NVFP4", "modelopt", "NVFP4", 16, None, None, None, (), excludes)
    matcher = ExcludeMatcher(declared)
    g = TensorGroup("mtp.layers.{}.mlp.experts.{}.gate_proj.weight", 0, "routed_expert", "weight",
                    "mtp.layers.{}.mlp.experts.{}.gate_proj", None, 0, ("BF16",), (4, 4), len(ids), 0, 0, 0,
                    "bf16", frozenset(), tuple(sorted(ids)))
    weighted = weighted_members(g, excludes)
    every = module_names(g, sorted(g.sub_indices))
    assert sum(count for _, count in weighted) == len(every)
    if len(weighted) == len(every):
        return
    if len(weighted) == 1:  # one member answers for the whole group
        assert {matcher.is_excluded(n) for n in every} == {matcher.is_excluded(weighted[0][0])}, excludes
        return
    by_digits = {len(n.split(".")[5]): matcher.is_excluded(n) for n, _ in weighted}
    assert len(by_digits) == len(weighted)  # one representative per digit count
    for n in every:
        assert matcher.is_excluded(n) == by_digits[len(n.split(".")[5])], (n, excludes)


def test_an_entry_naming_one_expert_is_seen_by_the_cross_check_and_the_engines(tmp_path):
    """`mtp.layers.0.mlp.experts.1*` excludes expert 1 only; the experts ship NVFP4. The cross-check reports
    exactly that module per projection (it used to ask the first expert only). vLLM asks its fused MoE once,
    as ``mtp.layers.0.mlp.experts``, and is_layer_skipped's experts branch excludes it when an entry
    contains that name (rules/quant/vllm.yaml, checked against vLLM's own class by
    tests/test_draft_quant_vllm.py): all four experts are built BF16, unusable for its own per-module
    reason."""
    report = _report("qwen", ((QWEN_MODULES["experts"], "nvfp4"),), ("mtp.fc", "mtp.layers.0.self_attn*",
                                                                     "mtp.layers.0.mlp.shared_expert*",
                                                                     "mtp.layers.0.mlp.experts.1*"), tmp_path)
    errors = [f for f in report.checkpoint.findings if f.code == "quantized-but-excluded"]
    assert sorted(f.subject for f in errors) == [f"mtp.layers.0.mlp.experts.1.{p}" for p in
                                                 ("down_proj", "gate_proj", "up_proj")]
    assert all(": 1 module(s)" in f.message for f in errors)
    vl = report.mtp.verdicts["vllm"]
    assert vl.verdict == "unusable" and "mtp-quantized-but-excluded" in vl.reasons
    assert vl.draft_quantization is None  # experts 0, 2, 3 are excluded with expert 1
    experts = next(m for m in report.mtp.modules if m.module == "mtp.layers.0.mlp.experts.{}.gate_proj")
    assert experts.built["vllm"] == "unquantized" and "mtp.layers.0.mlp.experts.1*" in experts.causes["vllm"]
    assert violations(report) == []
