"""Tests for the fixture generator (fixtures/), the sparse replica and the bundled example.

Every expectation here is re-derived from the written files with an independent header reader, the real
``safetensors`` library or transformers' own model classes; the generator's numbers are only compared
against those, never copied.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import math
import re
import struct
from pathlib import Path

import pytest

from fixtures.generate import FIXTURES, build_all, build_fixture
from fixtures.replica import build_replica_summary

ST_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
             "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
VALID = [n for n, s in FIXTURES.items() if not n.startswith("broken_")]
# MTP tensor prefixes per family as the engines' MTP loaders match them (sgl-project/sglang models/*_mtp.py,
# *_nextn.py; vllm-project/vllm model_executor/models/*_mtp.py), written out independently of the generator.
MTP_RE = {
    "qwen3_5_moe": r"^mtp\.", "qwen3_5": r"^mtp\.", "qwen3_next": r"^mtp\.", "nemotron_h": r"^mtp\.",
    "mimo": r"^model\.mtp_layers\.", "mimo_v2": r"^model\.mtp\.", "longcat_flash": r"^model\.mtp\.",
    "ernie4_5_moe": r"^model\.mtp_(emb_norm|hidden_norm|linear_proj|block)\.",
    "deepseek_v4": r"^mtp\.", "deepseek_v41": r"^mtp\.", "qwen4_exp": r"^mtp\.", "intern_s2": r"^mtp\.",
    "interns2_mobius": r"^mtp\.",
    # issue 10 part B (fixtures/families_2026_b.py)
    "nemotron3_5_transcribe": r"^llm\.mtp\.", "minimax_m3_dspark": r"^language_model\.model\.dspark\.",
    "mistral_large4": r"^mtp_dspark\.",
    "minimax_m3": r"^(language_model\.)?model\.mtp\.", "exaone_moe": r"^mtp\.", "exaone4_5": r"^mtp\.",
    "inkling": r"^model\.mtp\.", "mimo_v2_omni": r"^model\.mtp\.", "longcat_flash_ngram": r"^model\.mtp\.",
    "nemotron_h_omni": r"^language_model\.mtp\.",
    # issue 20 §5 (fixtures/families_2026_c.py): IQuest Q1's separate draft checkpoint
    "iquest_q1_mtp": r"^mtp\.",
    # DSpark stages (SG:models/deepseek_v4_dspark.py _remap_dspark_weight_name reads mtp.{stage}.*)
    "deepseek_v4_dspark": r"^mtp\.", "deepseek_v41_dspark": r"^mtp\.",
    # Nemotron Parse 3.5's one-step pair (VL:model_executor/models/nemotron_parse3_5_mtp.py ParseAuxMTPModel)
    "nemotron_parse35": r"^decoder\.extra_(heads|proj)\.0\.",
}
# DeepSeek-style families whose MTP layer may also (or instead) live under a second prefix: HY V4
# releases name it model.mtp_layers.0 (SG:models/hunyuan_v4_nextn.py), dots3 ships a draft embedding
# model.mtp.embed_tokens; unknown architectures (family None) use top-level mtp. / model.mtp.
EXTRA_MTP_RE = {"hy_v4": r"^model\.mtp_layers\.", "dots3_note": r"^model\.mtp\.", None: r"^(model\.)?mtp\."}


def read_header(path: Path) -> tuple[int, dict, int]:
    """Minimal independent reader: (N, header dict, file size); strict about the format."""
    with path.open("rb") as f:  # never read the data region: replica shards are GB-sized holes
        n = struct.unpack("<Q", f.read(8))[0]
        text = f.read(n)
    assert len(text) == n, f"{path}: header shorter than declared"
    assert text.startswith(b"{") and n % 8 == 0 and text.rstrip(b" ").endswith(b"}")
    return n, json.loads(text), path.stat().st_size


def check_layout(path: Path) -> dict:
    n, header, size = read_header(path)
    entries = sorted(((k, v) for k, v in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0])
    pos = 0
    for name, e in entries:
        begin, end = e["data_offsets"]
        assert begin == pos, f"{path}:{name} not contiguous"
        assert end - begin == math.prod(e["shape"]) * ST_DTYPES[e["dtype"]], f"{path}:{name} size"
        pos = end
    assert 8 + n + pos == size, f"{path}: data region does not cover the file exactly"
    return dict(entries)


def all_tensors(d: Path) -> dict[str, tuple[str, dict]]:
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        for k, v in check_layout(f).items():
            assert k not in out
            out[k] = (f.name, v)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fx")
    build_all(out)  # its time: BENCHMARKS.md (tests assert no wall-clock bounds)
    return out


def test_generation_is_deterministic_and_small(built, tmp_path):
    build_all(tmp_path)
    for name in FIXTURES:
        a, b = built / name, tmp_path / name
        files = sorted(p.name for p in a.iterdir())
        assert files == sorted(p.name for p in b.iterdir())
        for f in files:
            if (a / f).is_symlink():
                assert (a / f).readlink() == (b / f).readlink()
            else:
                assert (a / f).read_bytes() == (b / f).read_bytes(), f"{name}/{f} differs between runs"
        size = sum((a / f).lstat().st_size for f in files)
        assert size < 2_000_000, f"{name} is {size} bytes"


@pytest.mark.parametrize("name", VALID)
def test_valid_fixture_headers_match_spec(built, name):
    spec, d = FIXTURES[name], built / name
    tensors = all_tensors(d)
    assert len(tensors) == spec.expected_tensors
    assert sum(v["data_offsets"][1] - v["data_offsets"][0] for _, v in tensors.values()) == spec.expected_bytes
    assert logical_params(tensors) == spec.expected_params
    # Mistral's own format (params.json, consolidated*.safetensors and their index) or Hugging Face's
    mistral = (d / "params.json").exists()
    config = json.loads((d / ("params.json" if mistral else "config.json")).read_text())
    if spec.family in MTP_RE:
        assert sum(bool(re.match(MTP_RE[spec.family], k)) for k in tensors) == spec.mtp_tensors
    else:  # DeepSeek-style: layers with index >= num_hidden_layers
        text = config.get("text_config", config)
        big = [k for k in tensors
               if (m := re.match(r"^(?:model|language_model\.model|model\.language_model)\.layers\.(\d+)\.", k))
               and int(m.group(1)) >= text["num_hidden_layers"]]
        extra = [k for k in tensors if spec.family in EXTRA_MTP_RE and re.match(EXTRA_MTP_RE[spec.family], k)]
        assert len(big) + len(extra) == spec.mtp_tensors
    index = d / ("consolidated.safetensors.index.json" if mistral else "model.safetensors.index.json")
    if index.exists():
        doc = json.loads(index.read_text())
        assert doc["metadata"]["total_size"] == spec.expected_bytes
        assert doc["weight_map"] == {k: shard for k, (shard, _) in tensors.items()}
    else:
        assert [p.name for p in d.glob("*.safetensors")] == ["model.safetensors"]


def logical_params(tensors: dict) -> int:
    """Logical parameter count re-derived from names + dtypes (scales and zero points count 0)."""
    names = set(tensors)
    total = 0
    for k, (_, e) in tensors.items():
        numel = math.prod(e["shape"])
        # ModelSlim W8A8 companions: weight_offset (zero point), input_offset, deq_scale, quant_bias
        if re.search(r"(weight_scale(_inv|_2)?|input_scale|global_scale|[kv]_scale|qzeros|scales|g_idx|weight_shape|_scales|\.scale"
                     r"|weight_offset|input_offset|deq_scale|quant_bias)$", k):
            continue
        # DeepSeek-V4 FP4 experts: I8 nibble pairs next to an E8M0 ".scale"
        bare_scale = tensors.get(k[: -len(".weight")] + ".scale") if k.endswith(".weight") else None
        if k.endswith("_blocks") or (e["dtype"] == "U8" and re.sub(r"weight(_packed)?$", "weight_scale", k) in names) or (
                e["dtype"] == "I8" and bare_scale is not None and bare_scale[1]["dtype"] == "F8_E8M0"):
            total += numel * 2
        elif e["dtype"] == "I32" and (k.endswith(".qweight") or k.endswith(".weight_packed")):
            total += numel * 8
        else:
            total += numel
    return total


@pytest.mark.parametrize("name", VALID)
def test_real_safetensors_library_reads_every_shard(built, name):
    from safetensors import safe_open

    spec = FIXTURES[name]
    seen = 0
    for shard in spec.shards:
        _, header, _ = read_header(built / name / shard)
        with safe_open(built / name / shard, framework="pt") as f:
            for key in f.keys():
                assert list(f.get_slice(key).get_shape()) == header[key]["shape"]
                assert f.get_slice(key).get_dtype() == header[key]["dtype"]
                seen += 1
    assert seen == spec.expected_tensors


def test_quantization_shape_relations(built):
    counts = {"nvfp4": 0, "fp8_block": 0, "ct_nvfp4": 0, "awq": 0, "gptq": 0, "mxfp4": 0, "fp8_tensor": 0,
              "mxfp8": 0}
    for name in VALID:
        t = {k: v for k, (_, v) in all_tensors(built / name).items()}
        for k, e in t.items():
            s = e["shape"]
            if k.endswith(".weight_scale_2"):
                w, sc = t[k[:-2]], t[k[: -len("weight_scale_2")] + "weight"]
                assert sc["dtype"] == "U8" and w["dtype"] == "F8_E4M3" and s == []
                assert sc["shape"][:-1] == w["shape"][:-1] and sc["shape"][-1] * 2 == w["shape"][-1] * 16
                assert t[k[: -len("weight_scale_2")] + "input_scale"]["shape"] == []
                counts["nvfp4"] += 1
            elif k.endswith(".weight_scale_inv") and e["dtype"] == "U8":  # MXFP8: one E8M0 scale per 32 inputs
                w = t[k[: -len("_scale_inv")]]
                assert w["dtype"] == "F8_E4M3" and s == [w["shape"][0], math.ceil(w["shape"][1] / 32)]
                counts["mxfp8"] += 1
            elif k.endswith(".weight_scale_inv"):
                w = t[k[: -len("_scale_inv")]]
                assert w["dtype"] == "F8_E4M3" and s == [math.ceil(d / 128) for d in w["shape"]]
                counts["fp8_block"] += 1
            elif k.endswith(".weight_global_scale"):
                p, sc = t[k[: -len("global_scale")] + "packed"], t[k[: -len("global_scale")] + "scale"]
                assert s == [1] and p["dtype"] == "U8" and p["shape"][-1] * 2 == sc["shape"][-1] * 16
                counts["ct_nvfp4"] += 1
            elif k.endswith(".qweight"):
                base = k[: -len("qweight")]
                if base + "g_idx" in t:
                    assert s[0] * 8 == t[base + "g_idx"]["shape"][0] and s[1] == t[base + "scales"]["shape"][1]
                    counts["gptq"] += 1
                else:
                    assert s[1] * 8 == t[base + "scales"]["shape"][1] and e["dtype"] == "I32"
                    counts["awq"] += 1
            elif k.endswith("_blocks"):
                sc = t[k[: -len("blocks")] + "scales"]
                assert s[:-1] == sc["shape"] and s[-1] == 16
                counts["mxfp4"] += 1
            elif k.endswith(".weight_scale") and s == [] and t[k[: -len("_scale")]]["dtype"] == "F8_E4M3":
                counts["fp8_tensor"] += 1
    assert all(counts.values()), counts


def test_family_specific_facts(built):
    def cfg(n):
        return json.loads((built / n / "config.json").read_text())

    def quant(n):
        return json.loads((built / n / "hf_quant_config.json").read_text())["quantization"]

    q = cfg("qwen3_5_moe_nvfp4")
    assert q["text_config"]["mtp_num_hidden_layers"] == 1
    excl = quant("qwen3_5_moe_nvfp4")["exclude_modules"]
    assert excl == q["quantization_config"]["ignore"] and "mtp.layers.0*" in excl
    assert not any(fnmatch.fnmatchcase("mtp.fc", p) for p in excl)
    assert any(fnmatch.fnmatchcase("mtp.fc", p) for p in quant("qwen3_5_moe_mtp_fc_excluded")["exclude_modules"])
    t = all_tensors(built / "qwen3_5_moe_nvfp4")
    assert t["mtp.fc.weight"][1]["dtype"] == "BF16" and "mtp.layers.0.mlp.experts.3.down_proj.weight" in t
    assert t["model.language_model.layers.3.self_attn.k_proj.k_scale"][1]["shape"] == []
    assert not any(k.startswith("mtp.") for k in all_tensors(built / "qwen3_5_moe_nvfp4_nomtp"))
    inc = all_tensors(built / "qwen3_5_moe_mtp_incomplete")
    assert "mtp.fc.weight" not in inc and "mtp.layers.0.mlp.experts.1.up_proj.weight" in inc
    assert "mtp.layers.0.mlp.experts.2.up_proj.weight" not in inc
    pq = all_tensors(built / "qwen3_5_moe_mtp_partial_quant")
    assert "mtp.layers.0.mlp.experts.0.up_proj.weight_scale_2" in pq and pq["mtp.fc.weight"][1]["dtype"] == "BF16"
    assert "mtp_num_hidden_layers" not in json.dumps(cfg("qwen3_next_bf16")) and "mtp.fc.weight" in all_tensors(built / "qwen3_next_bf16")
    assert "re:mtp.*" in cfg("qwen3_5_moe_ct_nvfp4")["quantization_config"]["ignore"]
    assert "quantization_config" not in cfg("deepseek_v3_nvfp4") and "model.layers.3*" in quant("deepseek_v3_nvfp4")["exclude_modules"]
    assert sorted(p.name for p in (built / "deepseek_v3_fp8").glob("*.safetensors"))[-1] == "model-00005-of-000005.safetensors"
    assert sorted(p.name for p in (built / "gpt_oss_mxfp4").glob("*.safetensors")) == [
        f"model-0000{i}-of-00002.safetensors" for i in range(3)]
    assert sorted(p.name for p in (built / "qwen3_5_moe_nvfp4_fused").glob("*.safetensors"))[0] == (
        "model.safetensors-00001-of-00003.safetensors")
    glm = all_tensors(built / "glm4_moe")
    assert {k for k, (s, _) in glm.items() if s == "mtp.safetensors"} == {k for k in glm if k.startswith("model.layers.2.")}
    assert cfg("deepseek_v3_depth_mismatch")["num_nextn_predict_layers"] == 2
    assert cfg("kimi_k2")["num_nextn_predict_layers"] == 0 and FIXTURES["kimi_k2"].mtp_tensors == 0
    assert cfg("minimax_m2")["num_mtp_modules"] == 3 and FIXTURES["minimax_m2"].mtp_tensors == 0
    assert "model.layers.3.self_attn.indexer.wk.weight_scale_inv" in all_tensors(built / "deepseek_v32_fp8")
    mp4 = all_tensors(built / "deepseek_v3_nvfp4_mtp_fp4")
    assert mp4["model.layers.3.mlp.experts.0.up_proj.weight"][1]["dtype"] == "U8"
    mixed = quant("deepseek_v3_mixed")
    assert mixed["quant_algo"] == "MIXED_PRECISION" and {v["quant_algo"] for v in mixed["quantized_layers"].values()} == {"NVFP4", "FP8"}
    real = json.loads((Path(__file__).resolve().parents[1] / "fixtures/data/XiaomiMiMo__MiMo-7B__model.safetensors.index.json").read_text())
    assert json.loads((built / "mimo_7b/model.safetensors.index.json").read_text())["weight_map"] == real["weight_map"]


EXPECTED_BREAKAGE = {
    "broken_truncated_header": "short", "broken_header_len_beyond_file": "short",
    "broken_overlapping_offsets": "overlap", "broken_unknown_dtype": "dtype", "broken_shape_bytes_mismatch": "size",
}


@pytest.mark.parametrize("name", sorted(EXPECTED_BREAKAGE))
def test_broken_headers_are_broken_as_named(built, name):
    from safetensors import safe_open

    path = built / name / "model-00001-of-00002.safetensors"
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    kind = EXPECTED_BREAKAGE[name]
    if kind == "short":
        assert 8 + n > len(raw)
    else:
        header = json.loads(raw[8:8 + n])
        entries = sorted((v for k, v in header.items() if k != "__metadata__"), key=lambda v: v["data_offsets"][0])
        if kind == "overlap":
            assert any(b["data_offsets"][0] < a["data_offsets"][1] for a, b in zip(entries, entries[1:]))
        elif kind == "dtype":
            assert any(e["dtype"] not in ST_DTYPES for e in entries)
        else:
            assert any(math.prod(e["shape"]) * ST_DTYPES[e["dtype"]] != e["data_offsets"][1] - e["data_offsets"][0]
                       for e in entries)
    with pytest.raises(Exception):
        with safe_open(path, framework="pt") as f:
            [f.get_tensor(k) for k in f.keys()]
    check_layout(built / name / "model-00002-of-00002.safetensors")  # the other shard stays valid


def test_broken_directories_are_broken_as_named(built):
    idx = json.loads((built / "broken_missing_shard/model.safetensors.index.json").read_text())
    assert any(not (built / "broken_missing_shard" / f).exists() for f in set(idx["weight_map"].values()))
    esc = json.loads((built / "broken_index_escape/model.safetensors.index.json").read_text())
    assert "../outside.safetensors" in esc["weight_map"].values() and not (built / "outside.safetensors").exists()
    with pytest.raises(json.JSONDecodeError):
        json.loads((built / "broken_config_json/config.json").read_text())
    assert isinstance(json.loads((built / "broken_config_types/config.json").read_text())["num_hidden_layers"], str)
    loop = built / "broken_symlink_loop/model-00002-of-00002.safetensors"
    assert loop.is_symlink()
    with pytest.raises(OSError) as err:
        loop.open("rb")
    assert err.value.errno == errno.ELOOP
    bin_ = (built / "with_pickle/pytorch_model.bin").read_bytes()
    assert len(bin_) == 4096 and bin_[:1] != b"\x80" and bin_[:2] != b"PK"  # neither a pickle nor a torch zip
    assert len(all_tensors(built / "with_pickle")) == FIXTURES["with_pickle"].expected_tensors


def test_bundled_example_matches_fresh_generation(tmp_path):
    from ckptinspect.examples import EXAMPLE_DIR

    fresh = build_fixture("qwen3_5_moe_nvfp4", tmp_path)
    files = sorted(p.name for p in fresh.iterdir())
    assert files == sorted(p.name for p in EXAMPLE_DIR.iterdir() if p.name != "__pycache__")
    for f in files:
        assert (fresh / f).read_bytes() == (EXAMPLE_DIR / f).read_bytes(), f
    assert sum((EXAMPLE_DIR / f).stat().st_size for f in files) < 300_000


def replica_expectation(layer_types: list[str], experts: int, vision_depth: int) -> tuple[int, int]:
    """(tensors, mtp tensors) of the Qwen3.5 NVFP4 layout, counted by hand from the module list."""
    moe = 1 + experts * 3 * 4 + 3 + 1           # router, NVFP4 experts (4 tensors each), shared expert, its gate
    linear, full = 9, 6 + 2                      # GDN tensors; q/k/v/o + q/k norm + k_scale/v_scale
    layers = sum((linear if t == "linear_attention" else full) + 2 + moe for t in layer_types)
    vision = 3 + vision_depth * 12 + 2 + 4
    mtp = 4 + 2 + 6 + 1 + experts * 3 + 3 + 1
    return 3 + layers + vision + mtp, mtp


def test_replica_reduced_scale(tmp_path):
    s = build_replica_summary(tmp_path, layers=4, experts=8, shards=3)
    cfg = json.loads((s.path / "config.json").read_text())
    want, want_mtp = replica_expectation(cfg["text_config"]["layer_types"], 8, cfg["vision_config"]["depth"])
    tensors = all_tensors(s.path)
    assert len(tensors) == s.tensors == want
    assert sum(k.startswith("mtp.") for k in tensors) == want_mtp
    assert sum(k.endswith(".weight_scale_2") for k in tensors) == 4 * 8 * 3
    shards = sorted(s.path.glob("*.safetensors"))
    assert [p.name for p in shards] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    idx = json.loads((s.path / "model.safetensors.index.json").read_text())
    assert idx["metadata"]["total_size"] == sum(v["data_offsets"][1] - v["data_offsets"][0] for _, v in tensors.values())
    assert json.loads((s.path / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == "NVFP4"


@pytest.mark.slow
def test_replica_full_scale(tmp_path):
    s = build_replica_summary(tmp_path)  # its build time is a benchmark (BENCHMARKS.md section 4), not asserted
    cfg = json.loads((s.path / "config.json").read_text())["text_config"]
    want, want_mtp = replica_expectation(cfg["layer_types"], cfg["num_experts"], 27)
    assert (s.tensors, s.mtp_tensors, s.shards) == (want, 1553, 94) and want_mtp == 1553
    assert cfg["layer_types"].count("linear_attention") == 45 and cfg["num_experts"] == 512
    assert s.headers_over_100k > 47 and 40e6 < s.index_bytes < 45e6
    assert s.disk_bytes < s.header_bytes + s.index_bytes + 10_000_000 < s.apparent_bytes / 1000  # sparse
    n, header, size = read_header(s.path / "model-00047-of-00094.safetensors")
    assert size == 8 + n + max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")


TRANSFORMERS_MATCH = ["qwen3_5_moe_nvfp4", "qwen3_5_moe_nvfp4_fused", "qwen3_5_dense_bf16", "qwen3_next_bf16",
                      "qwen3_moe_bf16", "deepseek_v3_fp8", "deepseek_v32_fp8", "glm4_moe", "glm4_moe_lite",
                      "glm_moe_dsa", "longcat_flash", "mimo_v2_flash", "llama_bf16", "gpt_oss_mxfp4"]


def test_names_match_transformers_modeling():
    """Non-MTP tensor names equal the state_dict of transformers' own model class (meta device), after the
    checkpoint->runtime conversions transformers applies (per-expert -> fused experts, MXFP4 blocks)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    drop_keys = ("quantization_config", "auto_map", "pad_token_id", "bos_token_id", "eos_token_id")
    quant_suffix = re.compile(r"\.(weight_scale_inv|weight_scale_2|weight_scale|input_scale|k_scale|v_scale)$")
    for name in TRANSFORMERS_MATCH:
        spec = FIXTURES[name]
        cfg = transformers.AutoConfig.for_model(**{k: v for k, v in spec.config.items() if k not in drop_keys})
        auto = transformers.AutoModelForImageTextToText if "text_config" in spec.config else transformers.AutoModelForCausalLM
        with torch.device("meta"):
            runtime = set(auto.from_config(cfg).state_dict())
        ours = set()
        for t in spec.tensors:
            if t.mtp or quant_suffix.search(t.name):
                continue
            n = re.sub(r"(\.experts)\.\d+\.(gate|up)_proj\.weight$", r"\1.gate_up_proj", t.name)
            n = re.sub(r"(\.experts)\.\d+\.down_proj\.weight$", r"\1.down_proj", n)
            ours.add(re.sub(r"_(blocks|scales)$", "", n))
        assert ours == runtime, (name, sorted(ours ^ runtime)[:6])


@pytest.mark.parametrize("n", [99_992, 99_993, 99_994, 99_999, 100_000, 100_001])
def test_exact_header_length_files_for_the_range_boundary(tmp_path, n):
    from safetensors import safe_open

    from fixtures.writer import write_with_header_length

    spec = FIXTURES["llama_bf16"]
    path = tmp_path / "model.safetensors"
    size = write_with_header_length(path, spec.tensors, n)
    assert struct.unpack("<Q", path.read_bytes()[:8])[0] == n and path.stat().st_size == size
    with safe_open(path, framework="pt") as f:
        assert len(list(f.keys())) == spec.expected_tensors


def test_cli_entry_points(tmp_path, capsys):
    from fixtures.generate import main as generate_main
    from fixtures.replica import main as replica_main

    assert generate_main([str(tmp_path), "--only", "llama_bf16", "mimo_7b"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama_bf16", "mimo_7b"]
    assert replica_main([str(tmp_path / "rep"), "--layers", "1", "--experts", "2", "--shards", "2"]) == 0
    out = capsys.readouterr().out
    want, want_mtp = replica_expectation(["linear_attention"], 2, 27)
    assert f"tensors      {want:,} ({want_mtp:,} mtp.*)" in out
