"""Issue 20 §5: families against the engines' own code, and one fixture for every family.

- Every family's SGLang draft class equals what SGLang 0.5.23's `_config_draft_model`
  (SG:configs/model_config.py) rewrites the family's architectures to, read from that function's source
  with `ast` (no rule file consulted); a family whose architecture that function does not rewrite must
  name a class SGLang 0.5.23 registers (`EntryClass` of a module under sglang/srt/models) or none.
- Every concrete family in `rules list` has a generated fixture that the real pipeline assigns to it.
- GigaChat 3.5 (new): the MTP layer is found at model.layers.{L}, both engines are ready, and the
  dropped-MTP variant is unusable in both.
- IQuest Q1 (new): the target says its draft ships separately; the separate draft checkpoint
  (iquest_q1_mtp) has its layer under `mtp.`, is ready for SGLang (IQuestQ1MTP) and unusable when the
  layer is dropped; vLLM has no IQuest model.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

from ckptinspect.readiness import load_rules
from sglang_parser import ensure_sglang


def _strings(node: ast.AST, consts: dict[str, list[str]]) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.add(n.value)
        elif isinstance(n, ast.Name) and n.id in consts:
            out.update(consts[n.id])
    return out


@lru_cache(maxsize=1)
def sglang_draft_rewrites() -> dict[str, frozenset[str]]:
    """target architecture -> draft architectures `_config_draft_model` assigns for it."""
    src = Path(ensure_sglang()) / "sglang" / "srt" / "configs" / "model_config.py"
    tree = ast.parse(src.read_text(encoding="utf-8"))
    consts = {n.targets[0].id: sorted(_strings(n.value, {})) for n in tree.body
              if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_config_draft_model")
    out: dict[str, set[str]] = {}
    for node in fn.body:
        if not (isinstance(node, ast.If) and "is_draft_model" in ast.unparse(node.test)):
            continue
        sources: set[str] = set()
        for cmp in ast.walk(node.test):
            if isinstance(cmp, ast.Compare) and "architectures" in ast.unparse(cmp.left):
                for comp in cmp.comparators:
                    sources |= _strings(comp, consts)
        drafts = {s for st in node.body for a in ast.walk(st)
                  if isinstance(a, ast.Assign) and any("architectures" in ast.unparse(t) for t in a.targets)
                  for s in _strings(a.value, {})}
        for s in sources:
            out.setdefault(s, set()).update(drafts)
    return {k: frozenset(v) for k, v in out.items()}


@lru_cache(maxsize=1)
def sglang_entry_classes() -> frozenset[str]:
    models = Path(ensure_sglang()) / "sglang" / "srt" / "models"
    names: set[str] = set()
    for path in models.glob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
                names |= {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
    return frozenset(names)


def test_the_source_reading_finds_sglangs_rewrites():
    rewrites = sglang_draft_rewrites()
    # spot checks that the reader itself works (each read from the function's text above)
    assert rewrites["DeepseekV3ForCausalLM"] == {"DeepseekV3ForCausalLMNextN"}
    assert rewrites["DeepseekV4ForCausalLM"] == {"DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark"}
    assert len(rewrites) >= 30 and "GigaChat35ForCausalLMNextN" in sglang_entry_classes()


@pytest.mark.parametrize("fid", [f.id for f in load_rules().concrete()])
def test_sglang_draft_class_is_what_sglang_rewrites_to(fid):
    fam = load_rules().get(fid)
    draft = fam.engines["sglang"].draft_architecture
    rewrites = sglang_draft_rewrites()
    mapped = [rewrites[a] for a in fam.architectures if a in rewrites]
    if mapped:
        # an empty set: the branch names the architecture but keeps it (SGLang's DSparkMiniMaxDraftModel branch
        # only translates the draft's config, SG:configs/minimax_vl.py configure_minimax_m3_dspark)
        assert draft is not None and all(draft in m or (not m and draft in fam.architectures
                                                          and draft in sglang_entry_classes())
                                         for m in mapped), (fid, draft, mapped)
    elif draft is not None:  # rewritten elsewhere (e.g. a config class): the class must exist in 0.5.23
        assert draft in sglang_entry_classes(), (fid, draft)


def test_every_family_has_a_fixture_the_pipeline_assigns_to_it(fixture_specs, report):
    by_family: dict[str, list[str]] = {}
    for name, spec in fixture_specs.items():
        # the broken_* variants (fixtures/broken.py) carry their base's family but are unreadable on purpose
        if spec.family and spec.breaker is None and not name.startswith("broken_"):
            by_family.setdefault(spec.family, []).append(name)
    missing = [f.id for f in load_rules().concrete() if f.id not in by_family]
    assert not missing, f"families without a fixture: {missing}"
    for fid, names in sorted(by_family.items()):
        r = report(sorted(names)[0])
        assert r.mtp.family == fid, (fid, names[0], r.mtp.family)


def test_gigachat35_mtp_layer_found_and_ready(report, fixture_specs):
    mtp = report("gigachat35").mtp
    assert mtp.family == "gigachat35"
    assert [layer.prefix for layer in mtp.layers] == ["model.layers.2."]  # L = num_hidden_layers = 2
    assert mtp.tensors == fixture_specs["gigachat35"].mtp_tensors and not mtp.layers[0].missing
    assert (mtp.verdicts["sglang"].verdict, mtp.verdicts["sglang"].draft_architecture) == \
           ("ready", "GigaChat35ForCausalLMNextN")
    # vLLM 0.33.0 registers no GigaChat 3.5 model (no entry in the v0.33.0 wheel's registry.py)
    assert (mtp.verdicts["vllm"].verdict, mtp.verdicts["vllm"].draft_architecture) == ("unusable", None)
    assert mtp.verdicts["vllm"].reasons == ("engine-has-no-draft-model",)
    assert not [f for f in mtp.findings if f.severity == "error" and f.engine != "vllm"]


def test_gigachat35_dropped_mtp_is_unusable_in_both(report):
    mtp = report("gigachat35_nomtp").mtp
    assert (mtp.declared_layers, mtp.present_layers) == (1, 0)
    for engine in ("sglang", "vllm"):
        assert mtp.verdicts[engine].verdict == "unusable"
        assert "mtp-declared-but-absent" in mtp.verdicts[engine].reasons
    vllm_note = next(f for f in mtp.findings if f.engine == "vllm" and f.code == "mtp-declared-but-absent")
    assert "no GigaChat 3.5 model" in vllm_note.message


def test_gigachat35_gate_tensors_count_as_mtp(fixture_specs):
    """The gated norms' low-rank gates and the MLA output gate sit inside the NextN layer and are MTP."""
    mtp_names = {t.name for t in fixture_specs["gigachat35"].tensors if t.mtp}
    assert "model.layers.2.enorm.gate_up_projection.weight" in mtp_names
    assert "model.layers.2.self_attn.gate_proj.weight" in mtp_names


def test_iquest_q1_draft_checkpoint_is_ready_in_sglang(report, fixture_specs):
    r = report("iquest_q1_mtp")
    mtp = r.mtp
    assert mtp.family == "iquest_q1_mtp" and [layer.prefix for layer in mtp.layers] == ["mtp."]
    assert mtp.tensors == fixture_specs["iquest_q1_mtp"].mtp_tensors and not mtp.layers[0].missing
    assert (mtp.verdicts["sglang"].verdict, mtp.verdicts["sglang"].draft_architecture) == ("ready", "IQuestQ1MTP")
    assert mtp.verdicts["vllm"].verdict == "unusable" and mtp.verdicts["vllm"].draft_architecture is None
    # its fused experts (experts.fc / experts.proj) are routed experts of the draft layer, not "no experts"
    assert "no-routed-experts" not in {f.code for f in r.checkpoint.findings}
    assert any(g.component == "routed_expert" and g.pattern.endswith("experts.fc")
               for g in r.checkpoint.inventory.mtp_groups())


def test_iquest_q1_draft_without_its_layer_is_unusable(report):
    mtp = report("iquest_q1_mtp_nomtp").mtp
    assert (mtp.declared_layers, mtp.present_layers) == (1, 0)
    assert mtp.verdicts["sglang"].verdict == "unusable"
    assert "mtp-declared-but-absent" in mtp.verdicts["sglang"].reasons
    note = next(f for f in mtp.findings if f.engine == "sglang" and f.code == "mtp-declared-but-absent")
    assert "check_all_params_loaded" in note.message and note.severity == "error"


def test_iquest_q1_target_points_to_its_separate_draft(report):
    r = report("iquest_q1")
    assert r.mtp.family == "iquest_q1" and r.mtp.present_layers == 0
    assert {v.verdict for v in r.mtp.verdicts.values()} == {"absent"}
    note = next(f for f in (*r.checkpoint.findings, *r.mtp.findings) if f.code == "mtp-ships-separately")
    assert note.severity == "info" and "--speculative-draft-model-path" in note.message
