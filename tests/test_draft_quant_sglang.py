"""Differential test: per MTP module, what ckptinspect says SGLang 0.5.23 builds (quantized, unquantized,
or a load error) equals what SGLang's own quantization config classes decide on CPU
(tests/sglang_quant_oracle.py), for declarations of every method the engine rule models
(rules/quant/sglang.yaml).

The declarations are generated: each method's config in the exporter's layout, crossed with exclude /
ignore / quantized_layers / targets variants that cover the MTP modules in each way the engines read
(a prefix, a glob, one dotted part, a suffix, a regex, one shard of a fused module, nothing at all).
ckptinspect parses them with its own reader (quant/declared.py) as it would a checkpoint's files.
"""

from __future__ import annotations

import itertools
import re

import pytest

from ckptinspect.readiness.module_quant import module_quant_rules
from ckptinspect.quant.declared import read_declared
from ckptinspect.quant.engine_decision import ERROR, QUANTIZED, UNKNOWN, UNQUANTIZED, decide, method_rule
from ckptinspect.readiness.quant_method import engine_method
from ckptinspect.records import DeclaredQuant
from tests.quant_fixture_modules import fixture_module_rows, fixture_quant_config

# Modules as SGLang asks about them: Qwen3.5-style `mtp.*` (SG:models/qwen3_5_mtp.py, prefix "mtp")
# and DeepSeek-style `model.layers.61.*` (hf name; SG:models/deepseek_nextn.py), fused where the models fuse.
MODULES = [
    ("mtp.fc", "linear"),
    ("mtp.layers.0.self_attn.qkv_proj", "linear"),
    ("mtp.layers.0.self_attn.o_proj", "linear"),
    ("mtp.layers.0.mlp.experts", "moe"),
    ("mtp.layers.0.mlp.shared_expert.gate_up_proj", "linear"),
    ("mtp.layers.0.mlp.shared_expert.down_proj", "linear"),
    ("mtp.layers.0.mlp.gate", "linear"),
    ("model.layers.61.eh_proj", "linear"),
    ("model.layers.61.self_attn.o_proj", "linear"),
    ("model.layers.61.mlp.experts", "moe"),
    ("model.layers.3.mlp.experts", "moe"),
    ("model.layers.3.self_attn.qkv_proj", "linear"),
]
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

LIST_VARIANTS = [
    [],
    ["mtp"],
    ["mtp.fc"],
    ["fc"],
    ["mtp*"],
    ["mtp.layers.0*"],
    ["model.layers.61"],
    ["model.layers.61*"],
    ["layers.61"],
    ["mtp.layers.0.mlp.experts"],
    ["mtp.layers.0.mlp.experts.*"],
    ["mtp.layers.0.mlp.experts.0.gate_proj"],
    ["*.eh_proj", "lm_head"],
    ["mtp.layers.0.self_attn.q_proj"],
    ["mtp.layers.0.self_attn.q_proj", "mtp.layers.0.self_attn.k_proj", "mtp.layers.0.self_attn.v_proj"],
    ["mtp.layers.0.mlp.shared_expert.gate_proj", "mtp.layers.0.mlp.shared_expert.up_proj"],
    ["model.mtp.fc", "mlp.gate"],
    ["re:mtp.*", "re:.*experts.*"],
]


def _fp8_cases():
    for entries, key in itertools.product(LIST_VARIANTS, ["modules_to_not_convert", "ignored_layers", "ignore"]):
        qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128], key: entries}
        yield {"config.json": {"quantization_config": qc}, "sglang": qc}


def _modelopt_cases():
    for entries, algo in itertools.product(LIST_VARIANTS, ["NVFP4", "FP8"]):
        hq = {"producer": {"name": "modelopt"},
              "quantization": {"quant_algo": algo, "group_size": 16, "exclude_modules": entries}}
        yield {"hf_quant_config.json": hq, "sglang": hq}
    for entries in LIST_VARIANTS[:6]:  # the config.json layout, `ignore` key
        qc = {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": entries}
        yield {"config.json": {"quantization_config": qc}, "sglang": qc}


MIXED_LAYERS = [
    {"model.layers.3.mlp.experts.0.gate_proj": "NVFP4", "model.layers.3.self_attn.q_proj": "FP8"},
    {"model.layers.3.mlp.experts.0.gate_proj": "NVFP4", "mtp.layers.0.mlp.experts.0.gate_proj": "NVFP4",
     "mtp.layers.0.self_attn.q_proj": "FP8", "mtp.layers.0.self_attn.k_proj": "FP8",
     "mtp.layers.0.self_attn.v_proj": "FP8"},
    {"mtp.layers.0.self_attn.q_proj": "FP8", "mtp.layers.0.self_attn.k_proj": "NVFP4", "mtp.fc": "FP8"},
    {"mtp.layers.0.mlp.experts": "NVFP4", "model.layers.61.eh_proj": "FP8",
     "mtp.layers.0.mlp.shared_expert.gate_proj": "FP8"},
]


def _mixed_cases():
    for layers, entries in itertools.product(MIXED_LAYERS, [[], ["mtp.fc"], ["mtp*"]]):
        hq = {"quantization": {"quant_algo": "MIXED_PRECISION", "exclude_modules": entries,
                               "quantized_layers": {k: {"quant_algo": v, "group_size": 16} for k, v in layers.items()}}}
        yield {"hf_quant_config.json": hq, "sglang": hq}


CT_TARGETS = [["Linear"], ["re:model.layers.*"], ["re:.*experts.*", "re:.*self_attn.*"], ["re:mtp.*", "re:model.*"]]


def _ct_cases():
    weights = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
    acts = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}
    for targets, entries in itertools.product(CT_TARGETS, LIST_VARIANTS):
        if any("*" in e and not e.startswith("re:") for e in entries):
            continue  # compressed-tensors reads plain entries as names, not globs
        qc = {"quant_method": "compressed-tensors", "format": "float-quantized",
              "config_groups": {"group_0": {"targets": targets, "weights": weights, "input_activations": acts}},
              "ignore": entries}
        yield {"config.json": {"quantization_config": qc}, "sglang": qc}


DYNAMIC_VARIANTS = [
    {},
    {r"-:mtp\..*": {}},
    {r"-:.*mtp.*": {}, r"+:.*experts.*": {"bits": 8}},
    {r"+:mtp\.layers\.0\..*": {"bits": 8}, r"-:mtp\..*": {}},
    {r"-:model\.layers\.61\..*": {}, r"-:.*self_attn.*": {}},
    {r"-:.*\.fc": {}},
]


def _gptq_cases():
    for dynamic in DYNAMIC_VARIANTS:
        qc = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False,
              "dynamic": dynamic}
        # On a GPU SGLang converts a Marlin-compatible GPTQ config to gptq_marlin
        # (SG:configs/model_config.py override_quantization_method): ask that class.
        yield {"config.json": {"quantization_config": qc}, "sglang": qc, "as": "gptq_marlin"}


def _awq_cases():
    for entries in LIST_VARIANTS:
        if any(e.startswith("re:") or "*" in e for e in entries):
            continue  # AWQ reads plain substrings
        qc = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
              "modules_to_not_convert": entries}
        # AWQMarlinConfig.from_config needs the GPU's Marlin kernel types, so SGLang's plain AWQConfig
        # answers for Linears (same is_layer_skipped_awq check); for a fused MoE the rule cites
        # SG:layers/quantization/awq/awq.py AWQMarlinConfig.get_quant_method (skipped -> None).
        yield {"config.json": {"quantization_config": qc}, "sglang": qc, "as": "awq", "linear_only": True}


def _quark_cases():
    global_cfg = {"weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "is_dynamic": False,
                             "scale_format": "e8m0"},
                  "input_tensors": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "is_dynamic": True,
                                    "scale_format": "e8m0"},
                  "output_tensors": None, "bias": None}
    for entries in LIST_VARIANTS:
        if any("*" in e and not e.startswith("re:") for e in entries):
            continue
        qc = {"quant_method": "quark", "export": {"kv_cache_group": [], "pack_method": "reorder"},
              "global_quant_config": global_cfg, "layer_quant_config": {}, "layer_type_quant_config": {},
              "exclude": entries}
        yield {"config.json": {"quantization_config": qc}, "sglang": qc}


def _auto_round_cases():
    for blocks in [None, "model.layers", ["model.layers", "mtp.layers"], "model.layers.61,mtp"]:
        qc = {"quant_method": "auto-round", "bits": 4, "group_size": 128, "sym": True, "packing_format": "auto_round:auto_gptq"}
        if blocks is not None:
            qc["block_name_to_quantize"] = blocks
        # The quantized fused-MoE method reads a built layer's runner config after deciding, so fused MoE
        # answers are cited (SG:layers/quantization/auto_round.py get_layer_config step 2) not run.
        yield {"config.json": {"quantization_config": qc}, "sglang": qc, "linear_only": True}


EXTRA_CONFIGS = [
    {"mtp.fc": {"bits": 16}},
    {"mtp.fc": {"bits": 8}, "mtp.layers.0.self_attn.q_proj": {"bits": 16}},
    {r"mtp\..*": {"bits": 16}},
    {r"mtp\.layers\.0\.self_attn\.[qkv]_proj": {"bits": 16}, r".*\.fc": {"bits": 8, "group_size": 32}},
    {"mtp.layers.0.self_attn.q_proj": {"bits": 16}, "mtp.layers.0.self_attn.k_proj": {"bits": 16},
     "mtp.layers.0.self_attn.v_proj": {"bits": 16}, "model.layers.61.eh_proj": {"bits": 16}},
    {r"model\.layers\.(61|3)\..*": {"bits": 8}, "mtp.layers.0.mlp.shared_expert.gate_proj": {"bits": 4}},
    {"[unclosed": {"bits": 16}, "mtp.layers.0.mlp.gate": {"sym": False}},
]


def _auto_round_extra_cases():
    for blocks, extra in itertools.product([None, "model.layers", ["model.layers", "mtp.layers"]], EXTRA_CONFIGS):
        qc = {"quant_method": "auto-round", "bits": 4, "group_size": 128, "sym": True,
              "packing_format": "auto_round:auto_gptq", "extra_config": extra}
        if blocks is not None:
            qc["block_name_to_quantize"] = blocks
        yield {"config.json": {"quantization_config": qc}, "sglang": qc, "linear_only": True}


def _w8a8_int8_cases():
    for entries in LIST_VARIANTS:
        if any("*" in e and not e.startswith("re:") for e in entries):
            continue  # read as names (compressed-tensors' check_equal_or_regex_match)
        qc = {"quant_method": "w8a8_int8", "ignore": entries}
        yield {"config.json": {"quantization_config": qc}, "sglang": qc}


# ModelSlim's type map covers every weight; modules as above plus a DSpark stage (runtime `stages.0.*`,
# stored `mtp.0.attn.*` / `mtp.0.ffn.experts.0.w1`; SG:models/deepseek_v4_dspark.py).
MODELSLIM_MODULES = MODULES + [("stages.0.self_attn.o_proj", "linear"), ("stages.0.mlp.experts", "moe")]


def _modelslim_weights(prefix, kind):
    if kind == "moe":
        return [f"{prefix}.{e}.{p}.weight" for e in (0, 1) for p in ("gate_proj", "up_proj", "down_proj")]
    proj = prefix.rsplit(".", 1)[-1]
    return [f"{prefix.replace(proj, s)}.weight" for s in PACKED.get(proj, [proj])]


def _modelslim_cases():
    tensors = {w: kind for prefix, kind in MODULES for w in _modelslim_weights(prefix, kind)}
    def described(pick):
        return {w: pick(w, kind) for w, kind in tensors.items()}
    variants = [described(lambda w, k, t=t: t) for t in ("W8A8_DYNAMIC", "W8A8", "FLOAT", "W4A8_DYNAMIC", "W8A8_MXFP8")]
    # the sgl-project/sglang#37736 layout: MTP projections W8A8_DYNAMIC, fc and norms FLOAT
    variants.append(described(lambda w, k: "FLOAT" if ".fc." in w or ".gate." in w else "W8A8_DYNAMIC"))
    variants.append(described(lambda w, k: "FLOAT" if w.startswith("mtp.") else "W8A8_DYNAMIC"))  # #34353
    variants.append(described(lambda w, k: "FLOAT" if ".q_proj." in w or ".up_proj." in w else "W8A8_DYNAMIC"))
    variants.append(described(lambda w, k: "W4A8_DYNAMIC" if ".down_proj." in w else "W8A8_DYNAMIC"))
    variants.append(described(lambda w, k: "W16A16" if w.startswith("mtp.") else "W8A8"))
    variants.append({("language_model." + w if w.startswith("model.") else w): "W8A8_DYNAMIC" for w in tensors})
    variants.append({w.replace(".mlp.experts.", ".block_sparse_moe.experts.").replace(".gate_proj.", ".w1.")
                     .replace(".up_proj.", ".w3.").replace(".down_proj.", ".w2."): "W8A8_DYNAMIC" for w in tensors})
    variants.append({"mtp.0.attn.o_proj.weight": "W8A8_DYNAMIC", "mtp.0.ffn.experts.0.w1.weight": "W8A8_DYNAMIC",
                     "mtp.0.ffn.experts.0.w3.weight": "W8A8_DYNAMIC", "mtp.0.ffn.experts.0.w2.weight": "W8A8_DYNAMIC"})
    variants.append({**variants[-1], "stages.0.self_attn.o_proj.weight": "FLOAT"})
    for desc in variants:
        # SG:configs/model_config.py _find_quant_modelslim_config adds quant_method to the file's map
        yield {"modelslim": desc, "sglang": {**desc, "quant_method": "modelslim"}, "modules": MODELSLIM_MODULES,
               # SG:model_loader/loader.py _get_quantization_config on an NPU: the fused names under "model"
               "packed": {**PACKED, "model": PACKED}}


CASES = [*_fp8_cases(), *_modelopt_cases(), *_mixed_cases(), *_ct_cases(), *_gptq_cases(), *_awq_cases(),
         *_quark_cases(), *_auto_round_cases(), *_auto_round_extra_cases(), *_w8a8_int8_cases(),
         *_modelslim_cases()]


def _declared(case):
    """ckptinspect's declaration of a case. ModelSlim's type map is a file of its own that the pipeline
    does not read yet (BENCHMARKS.md section 16): the record is built as read_declared would build it."""
    if "modelslim" in case:
        return DeclaredQuant("modelslim", "modelslim", None, None, None, None, None,
                             ("quant_model_description.json",), (), raw=case["modelslim"])
    return read_declared(case.get("config.json", {}), case.get("hf_quant_config.json"))[0]


def _ckptinspect_answers(case):
    declared = _declared(case)
    method = engine_method(declared)
    section = module_quant_rules("sglang")
    section = {**section, "packed": PACKED}
    rule = method_rule(section, method)
    assert rule is not None, f"no module_quant rule for {method}"
    return method, {prefix: decide(section, rule, declared, prefix, kind) for prefix, kind in case.get("modules", MODULES)}


@pytest.fixture(scope="module")
def sglang_answers():
    from tests.sglang_quant_oracle import ask_sglang

    requests = []
    for case in CASES:
        method, _ = _ckptinspect_answers(case)
        requests.append({"method": case.get("as", method), "config": case["sglang"],
                         "modules": case.get("modules", MODULES), "packed": case.get("packed", PACKED)})
    return ask_sglang(requests)


def test_every_method_rule_is_exercised():
    methods = {_ckptinspect_answers(c)[0] for c in CASES}
    ruled = {m for entry in module_quant_rules("sglang")["methods"] for m in entry["methods"]}
    assert methods >= ruled - {"modelopt", "gptq_marlin", "awq_marlin", "auto_round", "intel/auto-round"}, \
        ruled - methods
    assert len(CASES) > 240


def test_engine_builds_equals_sglang_own_decision(sglang_answers):
    from tests.sglang_quant_oracle import built

    mismatches, errors = [], 0
    for case, theirs in zip(CASES, sglang_answers):
        assert "error" not in theirs, theirs
        method, ours = _ckptinspect_answers(case)
        method = case.get("as", method)
        for prefix, kind in case.get("modules", MODULES):
            if case.get("linear_only") and kind != "linear":
                continue
            answer = built(theirs[prefix], kind)
            errors += answer == ERROR
            mine = ours[prefix].built
            if mine != answer:
                mismatches.append(f"{method} {case['sglang']}: {prefix}: ckptinspect {mine} ({ours[prefix].why}), "
                                  f"SGLang {theirs[prefix]}")
    by_method = sorted({m.split(" ", 1)[0] for m in mismatches})
    assert not mismatches, f"{len(mismatches)} mismatches ({by_method}), e.g.:\n" + "\n".join(mismatches[:15])
    assert errors > 0  # the load-error answers (fused shards that disagree, no matching target) are covered


def test_fp8_reads_no_ignore_key():
    """SGLang's Fp8Config reads ignored_layers / modules_to_not_convert only (sglang.yaml note)."""
    case = {"config.json": {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                                     "ignore": ["mtp"]}}}
    _, ours = _ckptinspect_answers(case)
    assert ours["mtp.fc"].built == QUANTIZED
    assert {d.built for d in ours.values()} <= {QUANTIZED, UNQUANTIZED, UNKNOWN}


def test_fixture_checkpoints_agree_with_sglang(report, make_fixture):
    """The same question on the generated real-layout checkpoints (their declared x stored combinations):
    for every MTP module whose SGLang answer came from rules/quant/sglang.yaml, the report's answer is
    what SGLang's class decides for the fixture's own quantization config."""
    import json

    from tests.sglang_quant_oracle import ask_sglang, built

    section = module_quant_rules("sglang")
    requests, expected = [], []
    for name, method, rows in fixture_module_rows(report, "sglang", section["packed"],
                                                  lambda method: method_rule(section, method) is not None,
                                                  _sglang_runtime_name):
        d = make_fixture(name)
        config = fixture_quant_config(d)
        packed = section["packed"]
        if method == "modelslim":  # the type map as SG:configs/model_config.py _find_quant_modelslim_config hands it on
            config = {**json.loads((d / "quant_model_description.json").read_text()), "quant_method": "modelslim"}
            packed = {**packed, "model": packed}  # SG:model_loader/loader.py on an NPU: fused names under "model"
        # A GPU runs a Marlin-compatible GPTQ export as gptq_marlin (SGLang has no plain "gptq" class
        # registered in 0.5.23; SG:configs/model_config.py override_quantization_method).
        requests.append({"method": {"gptq": "gptq_marlin"}.get(method, method), "config": config,
                         "packed": packed,
                         "modules": [[p, k] for p, (k, _) in rows.items()]})
        expected.append((name, rows))
    assert len(requests) >= 3, [n for n, _ in expected]
    answers = ask_sglang(requests)
    assert not [a for a in answers if "error" in a], [(n, a) for (n, _), a in zip(expected, answers) if "error" in a]
    mismatches = [f"{name}: {p}: ckptinspect {ours}, SGLang {theirs[p]}"
                  for (name, rows), theirs in zip(expected, answers) for p, (kind, ours) in rows.items()
                  if built(theirs.get(p), kind) != ours]
    assert not mismatches, "\n".join(mismatches)


def _sglang_runtime_name(m, module: str, report) -> str:
    if "runtime module name" in m.causes["sglang"]:
        # DeepSeek NextN builds its layer as model.decoder (SG:models/deepseek_nextn.py
        # DeepseekModelNextN, layer_name "decoder"); its hf_to_sglang_mapper renames only
        # "model.layers.61", so the lists are asked about the decoder name here.
        return re.sub(r"^model\.layers\.\d+\.", "model.decoder.", module)
    # A draft class that maps no checkpoint names (exclude_names: runtime, e.g. MiMo-V2's MiMoV2MTP) is
    # asked about its runtime name only: ask SGLang about that name, as its model code does.
    from ckptinspect.inventory.mtp_prefix import concrete_prefix
    from ckptinspect.readiness import load_rules

    rule = load_rules().get(report.mtp.family).engines["sglang"]
    if rule.exclude_names != "runtime":
        return module
    layers = report.checkpoint.config.num_hidden_layers
    for rn in rule.runtime_names:
        for k in range(report.mtp.present_layers):
            source = concrete_prefix(rn.source, layers, k)
            if module.startswith(source):
                return concrete_prefix(rn.target, layers, k) + module[len(source):]
    return module
