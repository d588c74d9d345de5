"""Probe: layer streaming, corpus / saved continuations, the report-fed loader and gate (CPU).

(1) a layer-streamed teacher run gives exactly the in-memory numbers (three families, chunked);
(2) only one decoder layer is materialized at a time;
(3) depth-1 teacher acceptance on saved greedy continuations == greedy depth-1 acceptance;
(4) the probe reads only the shards the index lists; (5) the readiness gate fails closed;
(6) the bundled example and other bad input end in one line and exit 2.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import shutil
import subprocess
import sys

import pytest

from probe_helpers import ROOT, fixture, torch, write_prompts

from ckptinspect.errors import ProbeError
from ckptinspect.probe.runner import run_probe
from ckptinspect.render.probe_out import probe_json

PROMPTS = ["What are three ways to water a garden?", "Write a Python function that adds two numbers.",
           "Solve for x: 3x + 7 = 2x - 5.", "Traduis en français : le chat dort."]
EXAMPLE = os.path.join(ROOT, "ckptinspect", "examples", "qwen3_5_moe_nvfp4_tiny")
FORCE_STREAM_GIB = 0.1  # under the in-memory estimate's fixed 256 MiB slack, over any streamed fixture run


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def _same_numbers(a: dict, b: dict) -> None:
    for key in ("histogram", "sequences", "verify_steps", "accepted_drafts"):
        assert a["overall"].get(key) == b["overall"].get(key), key
    for da, db in zip(a["overall"]["depths"], b["overall"]["depths"], strict=True):
        for key in ("scored", "reached", "accepted"):
            assert da[key] == db[key], (key, da, db)
        assert da["sampled_acceptance"] == pytest.approx(db["sampled_acceptance"], abs=1e-5)


@pytest.mark.parametrize("kind", ["qwen35moe", "deepseek", "qwen35moe_nvfp4"])
def test_streamed_teacher_equals_in_memory(tmp_path, kind):
    prompts = write_prompts(tmp_path, PROMPTS)
    memory = probe_json(run_probe(fixture(kind), prompts=prompts, steps=3, mode="teacher", progress=False))
    # chunks of 16 tokens: one sequence per chunk, so the chunked path really runs
    streamed = probe_json(run_probe(fixture(kind), prompts=prompts, steps=3, mode="teacher", progress=False,
                         max_gpu_memory=FORCE_STREAM_GIB, stream_chunk_tokens=16))
    assert memory["main_model"]["source"] == "in-process transformers"
    assert streamed["main_model"]["source"] == "layer-streamed transformers"
    assert memory["overall"]["depths"][0]["reached"] > 50
    _same_numbers(memory, streamed)
    info = streamed["streaming"]
    from ckptinspect.probe.checkpoint import open_checkpoint

    pc = open_checkpoint(fixture(kind))
    layers = pc.checkpoint.config.num_hidden_layers
    assert info["layers"] == layers
    layer_bytes = sum(g.bytes for g in pc.inventory.groups if g.layer is not None and g.mtp_layer is None)
    assert info["bytes_read"] == layer_bytes  # every layer tensor read once, nothing else counted
    assert "streaming" not in memory


def test_streaming_holds_one_layer_at_a_time(tmp_path, monkeypatch):
    from ckptinspect.probe import stream

    seen: list[int] = []
    original = stream.StreamedMain._layer_state

    def spy(self, index, layer, stored):
        materialized = [i for i, lay in enumerate(self.layers) if not all(p.is_meta for p in lay.parameters())]
        seen.append(len(materialized))
        return original(self, index, layer, stored)

    monkeypatch.setattr(stream.StreamedMain, "_layer_state", spy)
    run_probe(fixture("qwen35moe"), prompts=write_prompts(tmp_path, PROMPTS[:2]), steps=1, mode="teacher",
              progress=False, max_gpu_memory=FORCE_STREAM_GIB)
    assert seen == [0, 0]  # when a layer loads, no other layer holds weights


def test_teacher_on_saved_continuations_equals_greedy_depth1(tmp_path):
    prompts = write_prompts(tmp_path, PROMPTS)
    saved = tmp_path / "cont.jsonl"
    greedy = probe_json(run_probe(fixture("qwen35moe"), prompts=prompts, steps=3, max_new_tokens=40, progress=False,
                       save_continuations_to=str(saved)))
    teacher = probe_json(run_probe(fixture("qwen35moe"), prompts=prompts, steps=3, mode="teacher", progress=False,
                        continuations=str(saved)))
    g, t = greedy["overall"]["depths"][0], teacher["overall"]["depths"][0]
    assert g["reached"] > 50 and 0 < g["accepted"] < g["reached"]
    assert (t["scored"], t["reached"], t["accepted"]) == (g["scored"], g["reached"], g["accepted"])
    assert t["conditional"] == g["conditional"]
    streamed = probe_json(run_probe(fixture("qwen35moe"), prompts=prompts, steps=3, mode="teacher", progress=False,
                         continuations=str(saved), max_gpu_memory=FORCE_STREAM_GIB))
    assert streamed["overall"]["depths"][0]["accepted"] == g["accepted"]
    rows = saved.read_text().splitlines()
    assert len(rows) == 1 + len(PROMPTS) and json.loads(rows[0])["ckptinspect_continuations"] == 1


def test_corpus_txt_documents_are_scored(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat and looked at the door.\n\nfirst check the chain, then the gears.\n\n")
    result = probe_json(run_probe(fixture("mimo"), corpus=str(corpus), steps=2, mode="teacher", progress=False))
    assert result["overall"]["sequences"] == 2 and set(result["categories"]) == {"corpus"}
    assert result["overall"]["depths"][0]["reached"] > 40
    with pytest.raises(ProbeError, match="--mode teacher"):
        run_probe(fixture("mimo"), corpus=str(corpus), progress=False)


def _indexed_copy_with_stray_shard(src: str, dst) -> str:
    """The fixture with an index for model.safetensors and an unindexed shard holding a zeroed copy
    of the MTP projection (sorted after the real shard, so a directory glob would let it win)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(os.path.join(src, "model.safetensors"))
    index = {"metadata": {}, "weight_map": {n: "model.safetensors" for n in weights}}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    stray = {"model.layers.2.eh_proj.weight": torch.zeros_like(weights["model.layers.2.eh_proj.weight"])}
    save_file(stray, str(dst / "zz-stray.safetensors"), metadata={"format": "pt"})
    return str(dst)


def test_probe_reads_only_indexed_shards(tmp_path):
    prompts = write_prompts(tmp_path, PROMPTS)
    base = probe_json(run_probe(fixture("deepseek"), prompts=prompts, steps=2, max_new_tokens=24, progress=False))
    path = _indexed_copy_with_stray_shard(fixture("deepseek"), tmp_path / "copy")
    copy = probe_json(run_probe(path, prompts=prompts, steps=2, max_new_tokens=24, progress=False))
    assert copy["overall"]["histogram"] == base["overall"]["histogram"]
    assert base["overall"]["depths"][0]["accepted"] > 10  # a zeroed eh_proj would accept almost nothing
    from ckptinspect.probe.checkpoint import open_checkpoint

    pc = open_checkpoint(path)
    assert {m.shard for m in pc.metas.values()} == {"model.safetensors"}
    assert "unindexed-shard" in {f.code for f in pc.checkpoint.findings}


def test_readiness_gate_uses_report_and_fails_closed(tmp_path, monkeypatch):
    import ckptinspect.pipeline as pipeline

    original = pipeline.report_from_raw

    def unusable(raw, **kw):
        report = original(raw, **kw)
        verdicts = {e: dataclasses.replace(v, verdict="unusable", reasons=("mtp-test-defect",))
                    for e, v in report.mtp.verdicts.items()}
        return dataclasses.replace(report, mtp=dataclasses.replace(report.mtp, verdicts=verdicts))

    monkeypatch.setattr(pipeline, "report_from_raw", unusable)
    with pytest.raises(ProbeError, match=r"sglang: unusable.*mtp-test-defect"):
        run_probe(fixture("mimo"), progress=False)

    def broken(raw, **kw):
        raise RuntimeError("assessment crashed")

    monkeypatch.setattr(pipeline, "report_from_raw", broken)
    with pytest.raises(RuntimeError, match="assessment crashed"):  # never swallowed, never a weaker check
        run_probe(fixture("mimo"), progress=False)


def test_bundled_example_and_foreign_tokenizer_exit_2(tmp_path):
    proc = _cli("probe", EXAMPLE, "--device", "cpu", "-q")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "no tokenizer" in proc.stderr and "Traceback" not in proc.stderr
    # the same checkpoint with a tokenizer whose ids exceed its 128-token vocabulary
    copy = tmp_path / "example"
    shutil.copytree(EXAMPLE, copy)
    for name in os.listdir(fixture("mimo")):
        if name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(os.path.join(fixture("mimo"), name), copy / name)
    proc = _cli("probe", str(copy), "--device", "cpu", "-q")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "vocab_size 128" in proc.stderr
    # a model over --max-gpu-memory in greedy mode: one line naming the way out
    proc = _cli("probe", fixture("mimo"), "--device", "cpu", "-q", "--max-gpu-memory", "0.01")
    assert proc.returncode == 2 and "--mode teacher streams" in proc.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_streamed_teacher_equals_in_memory(tmp_path):
    prompts = write_prompts(tmp_path, PROMPTS)
    kw = dict(prompts=prompts, steps=3, mode="teacher", progress=False, device="cuda:0", dtype="fp32")
    memory = probe_json(run_probe(fixture("qwen35moe_nvfp4"), **kw))
    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(0)  # whatever the in-memory run left for the collector
    streamed = probe_json(run_probe(fixture("qwen35moe_nvfp4"), max_gpu_memory=FORCE_STREAM_GIB, **kw))
    assert streamed["main_model"]["source"] == "layer-streamed transformers"
    _same_numbers(memory, streamed)
    info = streamed["streaming"]
    assert info["layers"] == 2 and info["peak_bytes"] - before <= info["estimate_bytes"]["total"] + (16 << 20), info


@pytest.mark.parametrize("kind", ["qwen35moe", "deepseek"])
def test_load_ahead_gives_the_serial_numbers(tmp_path, monkeypatch, kind):
    """Layer i+1 loaded (dequantized, fused) while layer i computes, its tensors interleaved with the
    chunks (on a GPU on a side stream; the switch forced on here, on the CPU): the same numbers as the
    serial load, the estimate holds the second layer and read, and the JSON says it ran."""
    from ckptinspect.probe import stream, streamed_run

    prompts = write_prompts(tmp_path, PROMPTS)
    kw = dict(prompts=prompts, steps=3, mode="teacher", progress=False, max_gpu_memory=FORCE_STREAM_GIB,
              stream_chunk_tokens=16)
    serial = probe_json(run_probe(fixture(kind), **kw))
    assert serial["streaming"]["load_ahead"] is False  # a CPU run never loads ahead by itself
    assert serial["streaming"]["estimate_bytes"]["layer_ahead"] == 0
    interleaved: list[int] = []
    original = stream._Ahead.pump

    def spy(self, count=None):
        if self.steps is not None:
            interleaved.append(self.index)
        return original(self, count)

    monkeypatch.setattr(stream._Ahead, "pump", spy)
    monkeypatch.setattr(streamed_run, "load_ahead_allowed", lambda device, total, limit: True)
    ahead = probe_json(run_probe(fixture(kind), **kw))
    _same_numbers(serial, ahead)
    info = ahead["streaming"]
    assert info["load_ahead"] is True and info["layers"] == serial["streaming"]["layers"]
    assert info["estimate_bytes"]["layer_ahead"] == info["estimate_bytes"]["layer"] + info["estimate_bytes"]["next_layer"]
    assert all("load_ahead_s" in row for row in info["per_layer"])
    # every layer after the first was loaded ahead, in shares after the chunks of the layer before it
    assert sorted(set(interleaved)) == list(range(1, info["layers"]))
    assert len(interleaved) > info["layers"]
