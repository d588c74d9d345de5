"""Issue 31 item 5: Mistral Large 4 in Mistral's own format (params.json, consolidated*.safetensors) and its DSpark
draft (mtp_dspark.*), as vLLM 0.34.0 reads them (rules/families/mistral_large4.yaml traces the path).

- The config: params.json wins over config.json where vLLM's config_format "auto" says so (header/index.py
  is_mistral_format), and config/mistral_params.py turns it into the config vLLM's own adapter builds; checked
  against that adapter itself (vLLM 0.34.0's transformers_utils/configs/mistral.py run on the fixture's params.json).
- The draft: vLLM 0.34.0 drafts it (method dspark, MistralLarge4DSparkModel, built BF16) and refuses an incomplete
  one; vLLM before 0.34 and SGLang 0.5.23 have no Mistral Large 4.
- The sources: a local directory, the Hub and the HF cache read the same files; a bad params.json is one error
  line naming it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckptinspect.errors import ConfigError
from ckptinspect.config.mistral_params import adapt_params
from ckptinspect.header.index import is_mistral_format
from ckptinspect.pipeline import build_report
from ckptinspect.settings import Settings
from conftest import run_cli
from fixtures.families_2026_e import MISTRAL_DSPARK, MISTRAL_LARGE4_PARAMS
from hub_repos import isolate_hf
from hub_server import HubServer
from sglang_parser import ensure_sglang
from vllm_source import vllm_034, vllm_034_text

NAME = "mistral_large4"


def _facts(report) -> dict:
    """What a report says of the model and its draft, for comparing sources."""
    mtp = report.mtp
    return {"family": report.checkpoint.family, "arch": report.checkpoint.config.architecture,
            "layers": (mtp.declared_layers, mtp.present_layers), "tensors": mtp.tensors,
            "totals": report.checkpoint.inventory.totals,
            "verdicts": {e: (v.verdict, v.method, v.draft_architecture, v.draft_quantization, v.reasons)
                         for e, v in mtp.verdicts.items()}}


# ---- the family and its draft --------------------------------------------------------------------------------

def test_params_json_model_is_mistral_large_4_with_its_dspark_draft(report, fixture_specs):
    r = report(NAME)
    config = r.checkpoint.config
    assert (r.checkpoint.family, config.architecture, config.model_type) == (
        "mistral_large4", "MistralLarge4ForCausalLM", "mistral_large_4")
    assert (config.num_hidden_layers, config.hidden_size, config.attention_kind) == (4, 64, "mla")
    assert (config.routed_experts, config.shared_experts, config.first_dense_layers) == (4, 1, 1)
    mtp = r.mtp
    assert (mtp.declared_layers, mtp.present_layers, mtp.complete) == (2, 2, True)
    assert mtp.tensors == fixture_specs[NAME].mtp_tensors == 26
    assert all(layer.prefix.startswith(MISTRAL_DSPARK) for layer in mtp.layers)
    # the trunk's consolidated names are classified (router beside the experts, not "other")
    groups = {g.component for g in r.checkpoint.inventory.groups if g.mtp_layer is None}
    assert {"embedding", "lm_head", "routed_expert", "shared_expert", "router", "attention", "mlp"} <= groups


def test_vllm_0_34_drafts_it_bf16_with_dspark_and_sglang_has_no_model(report):
    v = report(NAME).mtp.verdicts["vllm"]
    assert (v.verdict, v.method, v.draft_architecture, v.reasons) == ("ready", "dspark", "MistralLarge4DSparkModel", ())
    assert v.layers_used == 2
    s = report(NAME).mtp.verdicts["sglang"]
    # SGLang 0.5.23's own registry (rules/engines/architectures.yaml) has no model class for the target, so
    # the answer is that it cannot load the checkpoint at all, said once (the family's draft defect is not
    # repeated beside it)
    assert (s.verdict, s.draft_architecture, s.reasons) == ("unusable", None, ("arch-unknown-to-engine",))
    found = [f for f in report(NAME).mtp.findings if f.engine == "sglang"]
    assert [(f.code, f.severity) for f in found] == [("arch-unknown-to-engine", "error")]
    assert "registers no model class for MistralLarge4ForCausalLM" in found[0].message


def test_an_fp8_target_keeps_its_draft_bf16_in_vllm(make_fixture, tmp_path):
    """params.json's fp8 quantization is the target's: vLLM 0.34.0 builds this draft unquantized, so its BF16
    mtp_dspark.* tensors need no exclude list (and SGLang's answer is still that it has no model)."""
    fp8 = tmp_path / "fp8"
    shutil.copytree(make_fixture(NAME), fp8)
    params = {**MISTRAL_LARGE4_PARAMS, "quantization": {"qformat_weight": "fp8_e4m3", "qscheme_act": "TENSOR"}}
    (fp8 / "params.json").write_text(json.dumps(params))
    r = build_report(str(fp8), progress=False)
    assert r.checkpoint.declared is not None and r.checkpoint.declared.method == "fp8"
    v = r.mtp.verdicts["vllm"]
    assert (v.verdict, v.draft_quantization, v.reasons) == ("ready", None, ())  # None: no module built fp8
    assert r.mtp.modules and all(m.built["vllm"] == "unquantized" and m.matches["vllm"] for m in r.mtp.modules)
    assert r.mtp.verdicts["sglang"].reasons == ("arch-unknown-to-engine",)


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_vllm_before_0_34_has_no_mistral_large_4(version, make_fixture):
    r = build_report(str(make_fixture(NAME)), progress=False, engine_versions={"vllm": version})
    v = r.mtp.verdicts["vllm"]
    assert (v.verdict, v.reasons) == ("unusable", ("engine-has-no-draft-model",))


def test_an_incomplete_draft_is_unusable_in_vllm(report):
    mtp = report("mistral_large4_no_mask").mtp
    assert {m for layer in mtp.layers for m in layer.missing} == {"backbone.mask_embedding"}
    v = mtp.verdicts["vllm"]
    assert (v.verdict, v.reasons) == ("unusable", ("mtp-missing-tensors",))
    # SGLang's one answer stays: no model class for the target (not "SGLang leaves the parameters uninitialised")
    assert report("mistral_large4_no_mask").mtp.verdicts["sglang"].reasons == ("arch-unknown-to-engine",)


def _variant(tmp_path, name: str, params: dict, drop: tuple[str, ...] = ()):
    from fixtures.families_2026_e import mistral_large4
    from fixtures.generate import write_fixture

    return build_report(str(write_fixture(mistral_large4(name, params=params, drop_patterns=drop), tmp_path)),
                        progress=False)


def test_the_variant_modules_are_required_as_params_json_says(tmp_path):
    """target_projection exists with two or more target layers, joint_proj with the rnn head (dspark.py:109-117,
    157-165): vLLM raises without them, and nothing asks for them otherwise."""
    p = MISTRAL_LARGE4_PARAMS
    rnn = {**p, "mtp": {**p["mtp"], "dspark": {**p["mtp"]["dspark"], "head_type": "rnn"}}}
    one_tap = {**p, "mtp": {**p["mtp"], "target_activation_layers": "2"}}
    cases = [
        ("ml4_rnn", rnn, (), ()),
        ("ml4_rnn_no_joint", rnn, (MISTRAL_DSPARK + "autoregressive_head.joint_proj.*",), ("dspark-rnn-head-missing",)),
        ("ml4_no_projection", p, (MISTRAL_DSPARK + "backbone.target_projection.*",),
         ("dspark-target-projection-missing",)),
        ("ml4_one_tap", one_tap, (MISTRAL_DSPARK + "backbone.target_projection.*",), ()),
    ]
    for name, params, drop, reasons in cases:
        v = _variant(tmp_path, name, params, drop).mtp.verdicts["vllm"]
        assert (v.verdict, v.reasons) == ("unusable" if reasons else "ready", reasons), name
    text = " ".join(f.message for f in _variant(tmp_path, "ml4_rnn_no_joint2", rnn,
                                                  (MISTRAL_DSPARK + "autoregressive_head.joint_proj.*",)).mtp.findings)
    assert "mtp_dspark.autoregressive_head.joint_proj does not ship" in text


def test_a_target_without_its_draft_tensors_is_declared_but_absent(report):
    mtp = report("mistral_large4_nodraft").mtp
    assert (mtp.declared_layers, mtp.present_layers) == (2, 0)
    assert mtp.verdicts["vllm"].reasons == ("mtp-declared-but-absent",)
    assert mtp.verdicts["sglang"].reasons == ("arch-unknown-to-engine",)  # no model class at all


# ---- which config file wins, and the CLI ------------------------------------------------------------------------

def test_params_json_wins_only_beside_consolidated_shards(make_fixture, tmp_path):
    """vLLM's rule: params.json and a consolidated*.safetensors file -> Mistral's format, config.json ignored."""
    both = tmp_path / "both"
    shutil.copytree(make_fixture(NAME), both)
    (both / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                  "num_hidden_layers": 2, "hidden_size": 8}))
    assert build_report(str(both), progress=False).checkpoint.family == "mistral_large4"
    # the Hugging Face layout beside a stray params.json: config.json and model*.safetensors are what load
    hf = tmp_path / "hf"
    shutil.copytree(make_fixture("qwen3_dense_bf16"), hf)
    (hf / "params.json").write_text(json.dumps(MISTRAL_LARGE4_PARAMS))
    assert not is_mistral_format(os.listdir(hf))
    assert build_report(str(hf), progress=False).checkpoint.family == "qwen3"


def test_report_cli_reads_a_params_json_only_checkpoint(make_fixture):
    path = make_fixture(NAME)
    assert not (path / "config.json").exists()
    done = run_cli("report", str(path), "--format", "json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["model"]["family"], doc["model"]["architecture"]) == ("mistral_large4", "MistralLarge4ForCausalLM")
    assert doc["mtp"]["engines"]["vllm"]["verdict"] == "ready"


@pytest.mark.parametrize("edit, says", [
    (lambda p: "{\"dim\": 64,", "is not valid JSON"),
    (lambda p: json.dumps({**p, "n_layers": "four"}), "'n_layers' must be an integer, got 'four'"),
    (lambda p: json.dumps({**p, "dsa": {k: v for k, v in p["dsa"].items() if k != "topk"}}),
     "'dsa' lacks index_topk"),
    (lambda p: json.dumps({**p, "mtp": {**p["mtp"], "target_activation_layers": "2,1"}}),
     "'mtp.target_activation_layers' must list unique, ascending"),
    (lambda p: json.dumps({**p, "kv_sharing": {"source_layers_str": "0,2,1,3"}}), "'kv_sharing.source_layers_str'"),
    (lambda p: "[1, 2]", "is not a JSON object"),
])
def test_a_bad_params_json_is_one_error_line_naming_it(edit, says, make_fixture, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(make_fixture(NAME), bad)
    (bad / "params.json").write_text(edit(json.loads(json.dumps(MISTRAL_LARGE4_PARAMS))))
    done = run_cli("report", str(bad))
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "params.json" in lines[0] and says in lines[0], done.stderr


def test_adapter_refuses_dsa_without_mla_and_shared_experts():
    params = {k: v for k, v in MISTRAL_LARGE4_PARAMS.items() if k != "qk_nope_head_dim"}
    with pytest.raises(ConfigError, match="Mistral DSA requires MLA"):
        adapt_params(params)


# ---- the Hub and the HF cache read the same files ---------------------------------------------------------------

@pytest.fixture()
def hub(tmp_path, monkeypatch, make_fixture):
    isolate_hf(monkeypatch, tmp_path / "hf_home")
    repo = tmp_path / "repo"
    shutil.copytree(make_fixture(NAME), repo)
    # a Hugging Face copy beside it, as Mistral's releases ship both: neither its config nor its shards count
    (repo / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                  "num_hidden_layers": 2, "hidden_size": 8}))
    shutil.copy(repo / "consolidated-00001-of-00002.safetensors", repo / "model.safetensors")
    with HubServer() as server:
        server.add_repo("mistralai/Mistral-Large-4-tiny", repo)
        yield server, repo


def test_the_hub_and_the_hf_cache_give_the_local_report(hub):
    from huggingface_hub import snapshot_download

    from ckptinspect.sources.hf_cache import hub_cache_dir

    server, repo = hub
    local = build_report(str(repo), progress=False)
    assert local.checkpoint.family == "mistral_large4"
    remote = build_report("mistralai/Mistral-Large-4-tiny", progress=False, settings=Settings(endpoint=server.url))
    assert remote.checkpoint.kind == "hub" and _facts(remote) == _facts(local)
    fetched = {entry[1] for entry in server.stats()["log"]}
    assert not any("model.safetensors" in f and "consolidated" not in f for f in fetched)
    snapshot_download("mistralai/Mistral-Large-4-tiny", endpoint=server.url, cache_dir=str(hub_cache_dir()))
    cached = build_report("mistralai/Mistral-Large-4-tiny", progress=False,
                          settings=Settings(endpoint="http://127.0.0.1:9"))
    assert cached.checkpoint.kind == "hf-cache" and _facts(cached) == _facts(local)


def test_verify_refuses_mistral_format_instead_of_dry_loading_config_json(make_fixture, tmp_path):
    """verify hands the engine config.json; here vLLM reads params.json, so verify says it cannot model it
    rather than answer for another config (a config.json beside it is what it would otherwise send)."""
    from ckptinspect.verify import _request

    both = tmp_path / "both"
    shutil.copytree(make_fixture(NAME), both)
    (both / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                  "num_hidden_layers": 2, "hidden_size": 8}))
    with pytest.raises(ConfigError, match="Mistral's format .* which verify's dry-load does not model yet"):
        _request(str(both))


def test_a_snapshot_keeps_params_json_and_reports_the_same(make_fixture, tmp_path):
    path = make_fixture(NAME)
    out = tmp_path / "ml4.json.gz"
    done = run_cli("snapshot", str(path), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert _facts(build_report(str(out), progress=False)) == _facts(build_report(str(path), progress=False))


# ---- the premises, read from the engines' own code --------------------------------------------------------------

_RUN_VLLM_ADAPTER = textwrap.dedent('''
    import json, logging, sys, types
    src, cases = sys.argv[1], json.loads(sys.stdin.read())
    # vLLM's adapter module needs transformers and vllm.logger only: a logger stands in for the latter
    vllm = types.ModuleType("vllm"); vllm.__path__ = []
    logger = types.ModuleType("vllm.logger"); logger.init_logger = logging.getLogger
    sys.modules.update({"vllm": vllm, "vllm.logger": logger})
    import importlib.util
    spec = importlib.util.spec_from_file_location("vllm_mistral", src)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    out = []
    for params, keys in cases:
        try:
            config = mod.adapt_config_dict(params, defaults={})
        except Exception as exc:  # the engine refuses this params.json
            out.append({"refused": type(exc).__name__})
            continue
        row = {"config": {k: getattr(config, k, None) for k in keys}}
        if getattr(config, "mtp_config", None):
            draft = mod.get_mistral_large_4_dspark_config(config)
            row["draft"] = {k: getattr(draft, k, None) for k in ("architectures", "num_hidden_layers",
                            "num_target_layers", "dspark_head_type", "quantization_config")}
        out.append(row)
    print(json.dumps(out))
''')
COMMON_KEYS = ("architectures", "model_type", "num_hidden_layers", "hidden_size", "intermediate_size",
               "num_attention_heads", "num_key_value_heads", "n_routed_experts", "n_shared_experts",
               "first_k_dense_replace", "moe_intermediate_size", "num_experts_per_tok", "kv_lora_rank",
               "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "tie_word_embeddings", "layer_types",
               "sliding_window", "max_position_embeddings", "quantization_config")
LARGE4_KEYS = ("nope_layer_flags", "kv_source_layers", "index_sharing", "index_topk", "index_n_heads",
               "index_head_dim", "indexer_norm_eps", "indexer_ssmax_scaling", "indexer_nope_layer_flags",
               "fp8_kv_cache", "mtp_config")
_DENSE = {"dim": 32, "n_layers": 4, "head_dim": 8, "hidden_dim": 64, "n_heads": 4, "n_kv_heads": 2, "norm_eps": 1e-5,
          "vocab_size": 128}
_MOE = {"expert_hidden_dim": 16, "first_k_dense_replace": 1, "num_experts": 4, "num_experts_per_tok": 2,
        "route_every_n": 1, "routed_scale": 1.0, "num_expert_groups": 1, "num_expert_groups_per_tok": 1}
ADAPTER_CASES = {
    "mistral_large_4": (MISTRAL_LARGE4_PARAMS, COMMON_KEYS + LARGE4_KEYS),
    "dense_sliding": ({**_DENSE, "sliding_window": [16, 16, 16, None]}, COMMON_KEYS),
    "mixtral": ({**_DENSE, "moe": _MOE, "quantization": {"qformat_weight": "fp8_e4m3", "qscheme_act": "BLOCK",
                                                          "qscheme_weight": "BLOCK", "block_size_out": 128,
                                                          "block_size_in": 128}}, COMMON_KEYS),
    "large_3": ({**_DENSE, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
                 "q_lora_rank": 16, "moe": {**_MOE, "num_shared_experts": 1},
                 "llama_4_scaling": {"beta": 0.1, "original_max_position_embeddings": 64}}, COMMON_KEYS),
    # vLLM gives a dense MLA model a one-expert MoE with a shared expert, so it too needs llama_4_scaling
    "dense_mla": ({**_DENSE, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
                   "llama_4_scaling": {"beta": 0.1, "original_max_position_embeddings": 64}}, COMMON_KEYS),
}


def test_the_adapter_agrees_with_vllm_0_34s_own():
    """config/mistral_params.py against vLLM 0.34.0's adapt_config_dict (every architecture branch but the
    multimodal wrappers) and get_mistral_large_4_dspark_config, run in a subprocess on the same params.json."""
    src = vllm_034() / "transformers_utils" / "configs" / "mistral.py"
    cases = [[params, list(keys)] for params, keys in ADAPTER_CASES.values()]
    done = subprocess.run([sys.executable, "-c", _RUN_VLLM_ADAPTER, str(src)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    for (name, (params, _)), theirs in zip(ADAPTER_CASES.items(), answers):
        ours = adapt_params(params)
        assert {k: ours.get(k) for k in theirs["config"]} == theirs["config"], name
    # the draft vLLM builds: mtp.n_layers dense layers, two taps (so target_projection is built), BF16
    assert answers[0]["draft"] == {"architectures": ["MistralLarge4DSparkModel"], "num_hidden_layers": 2,
                                   "num_target_layers": 2, "dspark_head_type": "vanilla",
                                   "quantization_config": None}


def _without(mapping: dict, key: str) -> dict:
    return {k: v for k, v in mapping.items() if k != key}


REFUSED = {
    "dsa_without_mla": _without(MISTRAL_LARGE4_PARAMS, "qk_nope_head_dim"),
    "large_3_without_llama_4_scaling": _without(ADAPTER_CASES["large_3"][0], "llama_4_scaling"),
    "unknown_quantization": _DENSE | {"quantization": {"qformat_weight": "int3"}},
    "unparsed_dsa_key": MISTRAL_LARGE4_PARAMS | {"dsa": {**MISTRAL_LARGE4_PARAMS["dsa"], "window": 3}},
    "dsa_without_topk": MISTRAL_LARGE4_PARAMS | {"dsa": _without(MISTRAL_LARGE4_PARAMS["dsa"], "topk")},
    "kv_sharing_later_layer": MISTRAL_LARGE4_PARAMS | {"kv_sharing": {"source_layers_str": "0,2,2,3"}},
    "index_sharing_not_full_first": MISTRAL_LARGE4_PARAMS | {"dsa": {**MISTRAL_LARGE4_PARAMS["dsa"],
                                                                     "sharing": "shared,full"}},
}


def test_what_vllm_0_34s_adapter_refuses_the_report_refuses():
    src = vllm_034() / "transformers_utils" / "configs" / "mistral.py"
    cases = [[params, ["architectures"]] for params in REFUSED.values()]
    done = subprocess.run([sys.executable, "-c", _RUN_VLLM_ADAPTER, str(src)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    for (name, params), theirs in zip(REFUSED.items(), answers):
        assert "refused" in theirs, name  # the premise: vLLM 0.34.0 refuses it
        with pytest.raises(ConfigError, match="."):
            adapt_params(params)


def _literal(source: str, name: str):
    """A module-level literal (a name table) of an engine file, read without importing the engine."""
    for node in ast.parse(source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not found")


def test_every_draft_tensor_maps_to_a_module_vllm_0_34_builds(fixture_specs):
    """The fixture's mtp_dspark.* names through vLLM's own renaming (dspark.py _DSPARK_NAME_MAP, model.py
    _CHECKPOINT_NAME_MAP / _STACKED_PARAMS) land on the draft's modules."""
    model = vllm_034_text("models", "mistral", "mistral_large4", "nvidia", "model.py")
    dspark = vllm_034_text("models", "mistral", "mistral_large4", "nvidia", "dspark.py")
    ckpt_map, draft_map = _literal(model, "_CHECKPOINT_NAME_MAP"), _literal(dspark, "_DSPARK_NAME_MAP")
    stacked = _literal(model, "_STACKED_PARAMS")
    assert '_DSPARK_PREFIX = "mtp_dspark."' in dspark and 'if ckpt_name.startswith("mtp_"):' in model

    def rename(name: str) -> str:
        name = name.removeprefix("mtp_dspark.")
        if name.startswith("backbone.layers."):
            name = name.removeprefix("backbone.")
            for pattern, repl in ckpt_map:
                name = re.sub(pattern, repl, name)
        else:
            for pattern, repl in draft_map:
                name = re.sub(pattern, repl, name)
        for param, ckpt, _ in stacked:
            if ckpt in name:
                return name.replace(ckpt, param)
        return name

    names = {rename(t.name) for t in fixture_specs[NAME].tensors if t.mtp}
    layer = {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
             "self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_layernorm.weight", "self_attn.kv_b_proj.weight",
             "self_attn.o_proj.weight", "mlp.gate_up_proj.weight", "mlp.down_proj.weight"}
    expected = {f"model.layers.{k}.{n}" for k in range(2) for n in layer} | {
        "model.target_projection.weight", "model.target_norm.weight", "model.final_norm.weight",
        "model.mask_embedding", "model.markov_head.markov_w1.weight", "model.markov_head.markov_w2.weight"}
    assert names == expected
    # and the modules behind them (dspark.py MistralLarge4DSparkModel.__init__)
    for module in ("self.mask_embedding = nn.Parameter", "self.target_projection = ReplicatedLinear",
                   "self.target_norm = RMSNorm", "self.final_norm = RMSNorm", "self.markov_head = DSparkMarkovHead",
                   "is_moe=False", "has_indexer=False"):
        assert module in dspark, module


def test_vllm_0_34_drafts_mistral_large_4_in_bf16_and_refuses_a_missing_mask():
    spec = vllm_034_text("config", "speculative.py")
    override = spec[spec.index("def hf_config_override"):]
    assert 'getattr(text_config, "model_type", None) == "mistral_large_4"' in override
    assert "return get_mistral_large_4_dspark_config(text_config)" in override
    dspark_cfg = vllm_034_text("v1", "worker", "gpu", "spec_decode", "dspark", "config.py")
    assert 'and target.hf_text_config.model_type != "mistral_large_4"' in dspark_cfg  # no target quantization
    adapter = vllm_034_text("transformers_utils", "configs", "mistral.py")
    assert "config.quantization_config = None" in adapter and '"MistralLarge4DSparkModel"' in adapter
    registry = vllm_034_text("model_executor", "models", "registry.py")
    block = registry[registry.index('"MistralLarge4DSparkModel": ('):]
    assert '"MistralLarge4DSparkForCausalLM"' in block[:block.index(")")]
    dspark = vllm_034_text("models", "mistral", "mistral_large4", "nvidia", "dspark.py")
    assert 'required = {"model.mask_embedding"}' in dspark
    assert 'raise ValueError(f"DSpark checkpoint is missing' in dspark
    loader = vllm_034_text("model_executor", "model_loader", "default_loader.py")
    assert "model_config.quantization is None and loaded_weights is not None" in loader


def test_vllm_0_34_reads_params_json_beside_consolidated_shards():
    config = vllm_034_text("transformers_utils", "config.py")
    auto = config[config.index('    if config_format == "auto":'):]
    auto = auto[:auto.index('config_format = "hf"')]
    assert "is_mistral_model_repo(" in auto and "config_name=MISTRAL_CONFIG_NAME" in auto
    assert 'MISTRAL_CONFIG_NAME = "params.json"' in config
    repo = vllm_034_text("transformers_utils", "repo_utils.py")
    assert 'allow_patterns=["consolidated*.safetensors"]' in repo
    assert "fnmatch.fnmatch(os.path.basename(file), pattern)" in repo
    loader = vllm_034_text("model_executor", "model_loader", "default_loader.py")
    assert 'index_file = "consolidated.safetensors.index.json"' in loader


def test_sglang_0_5_23_has_no_mistral_large_4():
    srt = Path(ensure_sglang()) / "sglang" / "srt"
    hits = [p.name for p in srt.rglob("*.py")
            # the tensor prefix, not SGLang's Kimi kernel fused_kda_decode_mtp_dspark
            if re.search(r"MistralLarge4|mistral_large_4|mistral-large-4|(?<![A-Za-z0-9_])mtp_dspark",
                         p.read_text(encoding="utf-8", errors="replace"))]
    assert hits == []
    names = (srt / "utils" / "hf_transformers" / "mistral_utils.py").read_text(encoding="utf-8")
    rule = names[names.index("def is_mistral_model"):]
    assert '"mistral-large-3" in lower or "mistral-small-4" in lower or "leanstral" in lower' in rule
    assert "mistral-large-4" not in rule
