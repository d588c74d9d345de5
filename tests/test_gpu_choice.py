"""Any card can be planned (issue 26 item 7): nvidia-smi names, '8x NAME', a user GPU file
(--gpu-spec), --gpu-memory through the one memory model, suggestions that never name another card."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from ckptinspect.errors import CkptInspectError, PlanError
from ckptinspect.plan import find_gpu, load_gpus, plan_or_failure
from ckptinspect.plan.gpus import split_count
from ckptinspect.render.plan_json import plan_json
from ckptinspect.render.plan_text import render_plan_text
from conftest import ROOT, run_cli
from plan_checkpoints import deepseek_v3_fp8, mtp_ready

# What `nvidia-smi --query-gpu=name` (or torch.cuda.get_device_name, the same string) printed, as quoted in
# public threads:
#   NVIDIA H100 80GB HBM3, NVIDIA B200 - pytorch/test-infra PR 7631 (nvidia-smi --query-gpu=name)
#   NVIDIA H200 - NVIDIA/mig-parted issue 120 (nvidia-smi -q "Product Name")
#   NVIDIA H100 PCIe, NVIDIA A100-SXM4-80GB - neuralinternet/SN27 PR 291 (the GPU names it scores)
#   NVIDIA GeForce RTX 5090 - noonghunna/club-3090 issue 1261 (nvidia-smi table)
#   NVIDIA RTX PRO 6000 Blackwell Server Edition - bigstack-oss/cubecos issue 312
#   NVIDIA GB200 - sgl-project/sglang issue 11208 (python -m sglang.check_env "GPU 0,1,2,3")
#   NVIDIA GB10 (DGX Spark) - rossumai/nvgpu PR 37
SMI_NAMES = [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA B200", "B200"), ("NVIDIA H200", "H200-SXM"),
    ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA A100-SXM4-80GB", "A100-SXM-80GB"),
    ("NVIDIA GeForce RTX 5090", "RTX-5090"), ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000-Blackwell"),
    ("NVIDIA GB200", "GB200"), ("NVIDIA GB10", "DGX-Spark-GB10"),
    # the same vendor-prefix pattern for the rest of the catalog
    ("NVIDIA H20", "H20"), ("NVIDIA L40S", "L40S"), ("NVIDIA DGX Spark", "DGX-Spark-GB10"),
]

USER_CARD = {
    "name": "RTX-4090", "aliases": ["rtx-4090", "4090"], "vendor": "nvidia", "arch": "sm89",
    "compute_capability": "8.9", "memory_gib": 23.6, "bandwidth_tbps": 1.01,
    "tflops": {"bf16": 165, "fp8": 330, "fp4": None}, "interconnect": "pcie",
    "source": "nvidia-smi on the test box",
}


@pytest.mark.parametrize("smi, catalog", SMI_NAMES)
def test_nvidia_smi_names_resolve(smi, catalog):
    assert find_gpu(smi).name == catalog


@pytest.mark.parametrize("typed, count, name", [("8x NVIDIA H200", 8, "NVIDIA H200"), ("2 x h100", 2, "h100"),
                                                ("4×B200", 4, "B200"), ("NVIDIA H200", None, "NVIDIA H200"),
                                                ("5090", None, "5090")])
def test_split_count(typed, count, name):
    assert split_count(typed) == (count, name)


def test_count_in_the_gpu_name_sets_gpus(make_fixture):
    path = str(make_fixture("qwen3_5_moe_nvfp4"))
    both = run_cli("plan", path, "--gpu", "8x NVIDIA H200", "--format", "json")
    plain = run_cli("plan", path, "--gpu", "h200", "--gpus", "8", "--format", "json")
    assert both.stdout == plain.stdout and json.loads(both.stdout)["gpus"] == 8
    clash = run_cli("plan", path, "--gpu", "8x NVIDIA H200", "--gpus", "4")
    assert clash.returncode == 2 and "says 8 GPUs but --gpus says 4" in clash.stderr
    report = run_cli("report", path, "--gpu", "2x NVIDIA H200", "--format", "json")
    assert report.returncode == 0 and json.loads(report.stdout)["plan"]["gpus"] == 2, report.stderr
    missing = run_cli("plan", path, "--gpu", "NVIDIA H200")
    assert missing.returncode == 2 and "--gpus N" in missing.stderr and len(missing.stderr.splitlines()) == 1


# -- user GPU file ----------------------------------------------------------------------------------
def _gpu_file(tmp_path, entries, suffix=".yaml"):
    path = tmp_path / f"gpus{suffix}"
    doc = {"schema_version": 1, "gpus": entries}
    path.write_text(json.dumps(doc) if suffix == ".json" else yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_user_gpu_file_adds_a_card(tmp_path, suffix):
    path = _gpu_file(tmp_path, [USER_CARD], suffix)
    gpu = find_gpu("NVIDIA GeForce RTX 4090", spec_file=path)
    assert (gpu.name, gpu.arch, gpu.memory_gib, gpu.spec_file) == ("RTX-4090", "sm89", 23.6, str(path))
    with pytest.raises(PlanError, match="--gpu-spec"):  # without the file it is unknown, and says how to add it
        find_gpu("NVIDIA GeForce RTX 4090")
    assert find_gpu("h200", spec_file=path).name == "H200-SXM"  # the catalog is still there


def test_user_gpu_file_overrides_a_catalog_card(tmp_path):
    mine = {**USER_CARD, "name": "H200-SXM", "aliases": ["h200"], "arch": "sm90", "compute_capability": "9.0",
            "memory_gib": 100.0}
    path = _gpu_file(tmp_path, [mine])
    assert find_gpu("NVIDIA H200", spec_file=path).memory_gib == 100.0
    assert [g.name for g in load_gpus(path)].count("H200-SXM") == 1


@pytest.mark.parametrize("content, problem", [
    ("gpus: [", "invalid YAML"),
    ("schema_version: 1\ngpus: [{name: X}]\n", "required"),
    ("schema_version: 1\ngpus:\n  - {name: X, aliases: [], vendor: nvidia, arch: sm77, compute_capability: '7.7', "
     "memory_gib: 8, bandwidth_tbps: 1, tflops: {bf16: 1, fp8: null, fp4: null}, interconnect: pcie, source: my box}\n",
     "sm77"),
    ("[1, 2]", "object"),
    ("a: &x [1]\nb: *x\n", "anchors"),
    ("[" * 200 + "]" * 200, "nested deeper"),
])
def test_bad_gpu_file_is_one_line_naming_the_file(tmp_path, make_fixture, content, problem):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(CkptInspectError, match=re.escape(str(path))):
        find_gpu("h200", spec_file=path)
    res = run_cli("plan", str(make_fixture("qwen3_5_moe_nvfp4")), "--gpu", "h200", "--gpus", "8", "--gpu-spec", str(path))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert str(path) in res.stderr and problem in res.stderr and "Traceback" not in res.stderr


def test_gpu_file_goes_through_the_guarded_reader(tmp_path):
    import os

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # a FIFO must not block the read
    with pytest.raises(PlanError, match="not a regular file"):
        find_gpu("h200", spec_file=fifo)
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:
        fh.truncate(64 * 1024 * 1024)  # sparse: refused by size before any byte is read
    with pytest.raises(PlanError, match="over the"):
        find_gpu("h200", spec_file=big)
    with pytest.raises(PlanError, match="does not exist"):
        find_gpu("h200", spec_file=tmp_path / "absent.yaml")


def test_gpu_file_from_the_environment(tmp_path, make_fixture):
    path = _gpu_file(tmp_path, [{**USER_CARD, "memory_gib": 200.0, "arch": "sm90", "compute_capability": "9.0"}])
    fixture = str(make_fixture("qwen3_5_moe_nvfp4"))
    res = run_cli("plan", fixture, "--gpu", "NVIDIA GeForce RTX 4090", "--gpus", "8", "--format", "json",
                  env={"CKPTINSPECT_GPU_SPEC": str(path)})
    assert res.returncode in (0, 2) and "unknown GPU" not in res.stderr, res.stderr
    doc = json.loads(res.stdout)
    assert doc["gpu"]["name"] == "RTX-4090" and doc["gpu"]["memory_gib"] == 200.0


def test_schema_arches_are_the_engines_arch_classes():
    """A user's card always has engine rules: the schema allows exactly the arches both engines classify."""
    from ckptinspect.plan.rules import engine_rules

    schema = json.loads((ROOT / "rules" / "schema" / "gpus.schema.json").read_text())
    arches = set(schema["properties"]["gpus"]["items"]["properties"]["arch"]["enum"])
    for engine in ("sglang", "vllm"):
        assert arches == set(engine_rules(engine)["arch_classes"]), engine


# -- --gpu-memory: one memory model -----------------------------------------------------------------
def test_gpu_memory_changes_fit_kv_and_count():
    ck, mtp = deepseek_v3_fp8(), mtp_ready()
    whole = plan_or_failure(ck, mtp, gpu="h200", gpus=8)
    assert whole.ok and whole.min_gpus == 8
    shared = plan_or_failure(ck, mtp, gpu=find_gpu("h200", memory_gib=120), gpus=8)
    assert shared.ok and shared.gpu.memory_gib == 120
    # the same weights, a smaller pool: less KV per GPU
    assert shared.chosen.kv.budget_bytes < whole.chosen.kv.budget_bytes
    assert any("120 GiB usable per GPU (--gpu-memory)" in n.message for n in shared.notes)
    small = plan_or_failure(ck, mtp, gpu=find_gpu("h200", memory_gib=80), gpus=8)
    assert not small.ok and "needs" in small.reason
    assert small.hint.startswith("smallest that works: 16x H200-SXM")  # more of the same card
    text = render_plan_text(shared)
    assert "120 GiB" in text and plan_json(shared)["gpu"]["memory_gib"] == 120
    # vLLM's fraction is of the whole card: the shared-card value is scaled by 120 / 140.4
    util = next(float(f.value) for f in shared.commands["vllm"].flags if f.flag == "--gpu-memory-utilization")
    shared_note = next(n.message for n in shared.notes if "shared with other jobs" in n.message)
    assert f"--gpu-memory-utilization {util * 120 / 140.4:.3f}" in shared_note
    assert not any("shared with other jobs" in n.message for n in whole.notes)


def test_gpu_memory_on_the_command_line(make_fixture):
    path = str(make_fixture("qwen3_5_moe_nvfp4"))
    res = run_cli("report", path, "--gpu", "b200", "--gpus", "8", "--gpu-memory", "20", "--format", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["plan"]["gpu"]["memory_gib"] == 20
    alone = run_cli("report", path, "--gpu-memory", "20")
    assert alone.returncode == 2 and "--gpu-memory needs --gpu" in alone.stderr
    for bad in ("0", "-3", "x"):
        res = run_cli("plan", path, "--gpu", "b200", "--gpus", "8", "--gpu-memory", bad)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr


# -- suggestions never name a different card --------------------------------------------------------
def _other_cards(gpu_name: str) -> re.Pattern:
    words = {s for g in load_gpus() if g.name != gpu_name for s in (g.name, *g.aliases)}
    own = next(g for g in load_gpus() if g.name == gpu_name)
    words -= {own.name, *own.aliases}
    words = {w for w in words if not w.isdigit()}  # "5090" alone is too short a word to search prose for
    # "RTX PRO 6000", "rtx-pro-6000" and "rtx_pro_6000" are one name
    spelled = [r"[\s_-]?".join(re.escape(p) for p in re.split(r"[\s_-]+", w))
               for w in sorted(words, key=len, reverse=True)]
    return re.compile(r"(?<![\w.-])(" + "|".join(spelled) + r")(?![\w.-])", re.IGNORECASE)


def _without_sources(doc):
    if isinstance(doc, dict):
        return {k: _without_sources(v) for k, v in doc.items() if k != "source"}
    if isinstance(doc, list):
        return [_without_sources(v) for v in doc]
    return doc


@pytest.mark.parametrize("gpu", [g.name for g in load_gpus()])
@pytest.mark.parametrize("count", [1, 8])
def test_plan_text_names_no_other_card(gpu, count):
    """Whatever the outcome (fits, needs more, cannot run), the plan speaks of the card asked about."""
    result = plan_or_failure(deepseek_v3_fp8(), mtp_ready(), gpu=gpu, gpus=count)
    # every word the user reads as advice (reasons, hints, notes, flags); citations (`source`) may name
    # the card a fact was measured on
    text = json.dumps(_without_sources(plan_json(result)))
    found = _other_cards(gpu).findall(text)
    assert not found, (gpu, count, sorted(set(found)))


def test_unknown_gpu_points_to_gpu_spec(make_fixture):
    res = run_cli("plan", str(make_fixture("qwen3_5_moe_nvfp4")), "--gpu", "NVIDIA GeForce RTX 4090", "--gpus", "1")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "unknown GPU 'NVIDIA GeForce RTX 4090'" in res.stderr and "--gpu-spec FILE" in res.stderr
    assert "did you mean" not in res.stderr  # no catalog card is a 4090
    typo = run_cli("plan", str(make_fixture("qwen3_5_moe_nvfp4")), "--gpu", "NVIDIA H2000", "--gpus", "1")
    assert "did you mean h200?" in typo.stderr and "--gpu-spec" in typo.stderr


def test_probe_command_of_a_user_card_carries_its_gpu_file(tmp_path):
    import shlex

    from ckptinspect.plan.payoff import probe_command
    from plan_checkpoints import deepseek_v3_fp8 as ck

    path = _gpu_file(tmp_path, [USER_CARD])
    argv = shlex.split(probe_command(ck(), find_gpu("rtx-4090", spec_file=path)))
    assert argv[argv.index("--gpu") + 1] == "rtx-4090" and argv[argv.index("--gpu-spec") + 1] == str(path)
    assert "--gpu-spec" not in probe_command(ck(), find_gpu("h200"))


def test_probe_cost_model_reads_the_user_card(tmp_path):
    from ckptinspect.probe.cost import resolve_gpu

    path = _gpu_file(tmp_path, [USER_CARD])
    facts = resolve_gpu(find_gpu("NVIDIA GeForce RTX 4090", spec_file=path), "fp4")
    assert (facts.name, facts.bandwidth_bytes_s, facts.precision, facts.source) == ("RTX-4090", 1.01e12, "fp8", str(path))


def test_plan_notes_for_a_card_name_no_other_card():
    """Every plan-level note of rules/engines/common.yaml, for every catalog card its `when` selects."""
    from ckptinspect.plan.rules import engine_rules

    for note in engine_rules("common")["notes"]:
        arches = note["when"].get("arch")
        for gpu in load_gpus():
            if arches is None or gpu.arch in arches:
                found = _other_cards(gpu.name).findall(note["message"])
                assert not found, (gpu.name, note["message"], found)


def test_rules_validate_checks_a_user_gpu_file(tmp_path):
    good = _gpu_file(tmp_path, [USER_CARD])
    res = run_cli("rules", "validate", str(good))
    assert res.returncode == 0, res.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"schema_version": 1, "gpus": [{**USER_CARD, "arch": "sm77"}]}))
    res = run_cli("rules", "validate", str(bad))
    assert res.returncode == 2 and str(bad) in res.stderr and "sm77" in res.stderr
