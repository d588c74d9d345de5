"""Probe proofs of correctness on the trained tiny fixtures (CPU).

(1) depth-1 accepted drafts == transformers' own generate(use_mtp=True);
(2) K > 1 batched probe == a plain step-by-step speculative decoding loop;
(3) broken MTP layers fall far below the healthy one and trip the floor;
plus the CLI, bad input and the NVFP4 copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from probe_helpers import ROOT, fixture, load_main, torch, write_prompts

from ckptinspect.errors import NetworkError, ProbeError
from ckptinspect.probe.result import FLOOR_MISSING
from ckptinspect.render.probe_out import probe_json
from ckptinspect.probe.runner import run_probe
from ckptinspect.probe.prompts import Prompt, encode_prompt


def _encode(tok, prompt, chat):
    return encode_prompt(tok, prompt, chat=chat, vocab_size=None, source="test")

PROMPTS = ["What are three ways to water a garden?", "Write a Python function that adds two numbers.",
           "Solve for x: 3x + 7 = 2x - 5.", "Traduis en français : le chat dort."]
NEW = 40


def test_depth1_accepts_equal_transformers_generate_use_mtp(tmp_path):
    """transformers' MTPCandidateGenerator counts accepted drafts per verify step; the probe's walk
    at K=1 must see the same steps with the same accept counts."""
    from transformers import AutoTokenizer
    from transformers.generation import candidate_generator as cg

    path = fixture("deepseek")
    result = run_probe(path, prompts=write_prompts(tmp_path, PROMPTS), steps=1, max_new_tokens=NEW,
                       batch_size=1, progress=False)
    probe_hist = probe_json(result)["overall"]["histogram"]

    main, _ = load_main(path)
    # transformers ties the MTP regex to DeepSeek-V3's layer 61; point it at this depth (documented workaround).
    main._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{main.config.num_hidden_layers}\..*"]
    main.config.name_or_path = path
    tok = AutoTokenizer.from_pretrained(path)
    records: list[tuple[int, int]] = []
    original = cg.MTPCandidateGenerator.update_candidate_strategy

    def spy(self, input_ids, scores, num_matches):
        records.append((input_ids.shape[1], int(num_matches)))
        return original(self, input_ids, scores, num_matches)

    hist = [0, 0]
    cg.MTPCandidateGenerator.update_candidate_strategy = spy
    try:
        for text in PROMPTS:
            ids = _encode(tok, Prompt("t", text), chat=True)
            records.clear()
            out = main.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW, use_mtp=True,
                                pad_token_id=tok.pad_token_id)
            n_total = out.shape[1]
            for after_len, n in records:
                cur_len = after_len - n - 1  # transformers passes input_ids with the step's tokens appended
                start = cur_len - 2
                if cur_len > len(ids) and start + 3 <= n_total - 1:  # skip prefill; draft + bonus fit
                    hist[n] += 1
    finally:
        cg.MTPCandidateGenerator.update_candidate_strategy = original
    assert sum(hist) > 50
    assert probe_hist == hist
    assert 0 < hist[1] < sum(hist)  # the fixture neither always nor never accepts


def _reference_spec_decode(main, head, prompt_ids, new_tokens, k_steps, eos):
    """Plain speculative decoding: full recompute each step, MTP chained causally, greedy verify."""
    x = list(prompt_ids)
    steps: list[tuple[int, int]] = []  # (start t, accepted)
    dec = main.get_decoder()
    lm = main.get_output_embeddings()
    with torch.no_grad():
        x.append(int(lm(dec(input_ids=torch.tensor([x])).last_hidden_state)[0, -1].argmax()))
        while len(x) < len(prompt_ids) + new_tokens and x[-1] not in eos:
            ids = torch.tensor([x])
            h = dec(input_ids=ids).last_hidden_state
            c = len(x)
            emb = head.embed(ids[:, 1:])
            hid = h[:, :-1]
            drafts = []
            for depth in range(k_steps):
                s = emb.shape[1]
                pos = torch.arange(1, s + 1)[None]
                mask = torch.full((s, s), torch.finfo(h.dtype).min).triu(1)[None, None]
                out = head.step(emb, hid, pos, mask)
                d = int(head.logits(out)[0, -1].argmax())
                drafts.append(d)
                emb = torch.cat([emb, head.embed(torch.tensor([[d]]))], dim=1)
                hid = torch.cat([hid, out[:, -1:]], dim=1)
            full = torch.tensor([x + drafts])
            target = lm(dec(input_ids=full).last_hidden_state)[0].argmax(-1).tolist()
            n = 0
            while n < k_steps and drafts[n] == target[c - 1 + n]:
                n += 1
            steps.append((c - 2, n))
            x += drafts[:n] + [target[c - 1 + n]]
    return x, steps


@pytest.mark.parametrize("kind", ["deepseek", "mimo"])
def test_batched_chain_equals_step_by_step_loop(tmp_path, kind):
    from transformers import AutoTokenizer

    from ckptinspect.probe.runner import build_head

    k_steps = 3
    path = fixture(kind)
    prompts = PROMPTS[:3]
    result = run_probe(path, prompts=write_prompts(tmp_path, prompts), steps=k_steps, max_new_tokens=NEW,
                       batch_size=1, progress=False)
    main, spec = load_main(path)
    head = build_head(spec, main, path)
    tok = AutoTokenizer.from_pretrained(path)
    hist = [0] * (k_steps + 1)
    for text in prompts:
        ids = _encode(tok, Prompt("t", text), chat=True)
        seq, steps = _reference_spec_decode(main, head, ids, NEW, k_steps, {tok.eos_token_id})
        n_total = min(len(seq), len(ids) + NEW)
        for start, n in steps:
            if start + k_steps + 2 <= n_total - 1:
                hist[n] += 1
    assert sum(hist) > 20
    assert probe_json(result)["overall"]["histogram"] == hist
    assert hist[0] < sum(hist) and hist[k_steps] < sum(hist)  # informative: neither all nor nothing


def _broken_copy(src: str, dst: str, how: str) -> str:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(os.path.join(src, "model.safetensors"))
    pre = "model.layers.2."
    gen = torch.Generator().manual_seed(0)
    if how == "concat_swapped":
        w = weights[pre + "eh_proj.weight"]
        half = w.shape[1] // 2
        weights[pre + "eh_proj.weight"] = torch.cat([w[:, half:], w[:, :half]], dim=1).contiguous()
    elif how == "hnorm_zeroed":
        weights[pre + "hnorm.weight"] = torch.zeros_like(weights[pre + "hnorm.weight"])
    elif how == "shuffled":
        for name in [n for n in weights if n.startswith(pre) and n.endswith("proj.weight")]:
            w = weights[name]
            weights[name] = w.flatten()[torch.randperm(w.numel(), generator=gen)].reshape(w.shape).contiguous()
    save_file(weights, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_broken_mtp_layers_fall_below_healthy_and_trip_floor(tmp_path):
    prompts = write_prompts(tmp_path, PROMPTS)
    healthy = run_probe(fixture("deepseek"), prompts=prompts, steps=1, max_new_tokens=NEW, progress=False)
    assert healthy.alpha1 > 0.4 and not healthy.findings
    alphas = {}
    for how in ("concat_swapped", "hnorm_zeroed", "shuffled"):
        path = _broken_copy(fixture("deepseek"), str(tmp_path / how), how)
        r = run_probe(path, prompts=prompts, steps=1, max_new_tokens=NEW, progress=False)
        alphas[how] = r.alpha1
        assert r.alpha1 < healthy.alpha1 - 0.1, (how, r.alpha1, healthy.alpha1)
        codes = {f.code for f in r.findings}
        if r.alpha1 < FLOOR_MISSING:
            assert "mtp-acceptance-floor" in codes
            assert any("MTP weights missing or mis-wired" in f.message for f in r.findings)
        else:
            assert codes & {"mtp-acceptance-low", "mtp-acceptance-floor"}
    assert min(alphas.values()) < FLOOR_MISSING


def test_nvfp4_copy_dequantizes_and_tracks_bf16(tmp_path):
    prompts = write_prompts(tmp_path, PROMPTS)
    bf16 = probe_json(run_probe(fixture("qwen35moe"), prompts=prompts, steps=2, max_new_tokens=NEW, progress=False))
    fp4 = probe_json(run_probe(fixture("qwen35moe_nvfp4"), prompts=prompts, steps=2, max_new_tokens=NEW, progress=False))
    assert fp4["main_model"]["dequantized"] is True and bf16["main_model"]["dequantized"] is False
    assert fp4["cost_model"]["precision"] in ("fp4", "fp8")
    # a trained, non-degenerate fixture: drafts neither always nor never right, real distributions
    assert 0.3 < bf16["overall"]["depths"][0]["conditional"] < 0.99
    assert 0.0 < bf16["overall"]["depths"][0]["sampled_acceptance"] < 1.0
    assert abs(fp4["overall"]["depths"][0]["conditional"] - bf16["overall"]["depths"][0]["conditional"]) < 0.25
    assert not any(f.startswith("ckptinspect-probe-") for f in os.listdir(os.path.dirname(fixture("qwen35moe_nvfp4"))))


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=300)


def test_cli_json_matches_schema_and_teacher_mode(tmp_path):
    import jsonschema

    prompts = write_prompts(tmp_path, PROMPTS[:2])
    proc = _cli("probe", fixture("mimo"), "--device", "cpu", "--prompts", prompts, "--max-new-tokens", "24",
                "--steps", "2", "--format", "json", "-q")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    schema = json.load(open(os.path.join(ROOT, "ckptinspect", "probe", "probe.schema.json")))
    jsonschema.validate(data, schema)
    assert data["family"] == "mimo" and data["recommendation"]["sglang"]["num_draft_tokens"] == \
        data["recommendation"]["sglang"]["num_steps"] + 1
    hist = data["overall"]["histogram"]
    assert sum(n * h for n, h in enumerate(hist)) == data["overall"]["accepted_drafts"]
    teacher = _cli("probe", fixture("mimo"), "--device", "cpu", "--prompts", prompts, "--mode", "teacher",
                   "--format", "json", "-q")
    assert teacher.returncode == 0, teacher.stderr
    assert json.loads(teacher.stdout)["overall"]["depths"][0]["scored"] > 0


def test_plot_writes_a_png_with_one_curve_per_depth(tmp_path):
    pytest.importorskip("matplotlib")
    prompts = write_prompts(tmp_path, PROMPTS[:2])
    png = tmp_path / "acceptance.png"
    proc = _cli("probe", fixture("mimo"), "--device", "cpu", "--prompts", prompts, "--max-new-tokens", "16",
                "--steps", "2", "--plot", str(png), "-q")
    assert proc.returncode == 0, proc.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_cli_bad_inputs_one_line_exit_2(tmp_path):
    # no MTP layer: quote the readiness verdict
    src = fixture("deepseek")
    nomtp = tmp_path / "nomtp"
    shutil.copytree(src, nomtp)
    from safetensors.torch import load_file, save_file

    w = {k: v for k, v in load_file(str(nomtp / "model.safetensors")).items() if not k.startswith("model.layers.2.")}
    save_file(w, str(nomtp / "model.safetensors"), metadata={"format": "pt"})
    proc = _cli("probe", str(nomtp), "--device", "cpu", "-q")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "no usable MTP layer" in proc.stderr and "verdict" in proc.stderr
    # remote code is never implied
    remote = tmp_path / "remote"
    shutil.copytree(src, remote)
    conf = json.loads((remote / "config.json").read_text())
    conf.update(model_type="deepseek_v3", auto_map={"AutoConfig": "x.Y"}, architectures=["X"])
    conf["model_type"] = "my_private_arch"
    (remote / "config.json").write_text(json.dumps(conf))
    with pytest.raises(ProbeError, match="--trust-remote-code"):
        run_probe(str(remote), progress=False)
    # not enough memory: error before loading, with the estimate
    proc = _cli("probe", src, "--device", "cpu", "-q", env={"CKPTINSPECT_PROBE_MEMORY_LIMIT": "1000"})
    assert proc.returncode == 2 and "GiB" in proc.stderr and "needs about" in proc.stderr
    proc = _cli("probe", str(tmp_path / "missing"), "-q")
    assert proc.returncode == 2 and proc.stderr.startswith("error:")


@pytest.mark.parametrize("kind", ["deepseek", "qwen35moe"])
def test_main_url_against_protocol_server_equals_in_process(tmp_path, kind):
    from probe_server import ProbeTestServer

    prompts = write_prompts(tmp_path, PROMPTS[:3])
    local = run_probe(fixture(kind), prompts=prompts, steps=2, max_new_tokens=NEW, batch_size=1, progress=False)
    with ProbeTestServer(fixture(kind)) as server:
        remote = run_probe(fixture(kind), prompts=prompts, steps=2, max_new_tokens=NEW, main_url=server.url,
                           progress=False)
    rj, lj = probe_json(remote), probe_json(local)
    assert rj["main_model"]["source"].startswith("SGLang-compatible server")
    assert rj["overall"]["histogram"] == lj["overall"]["histogram"] and sum(lj["overall"]["histogram"]) > 10
    assert lj["overall"]["histogram"][0] < sum(lj["overall"]["histogram"])  # not a degenerate all-accept
    assert rj["overall"]["depths"][0]["sampled_acceptance"] is None  # no target logits over the wire
    # the one bounded network client's error: it names the server's URL and what went wrong
    with pytest.raises(NetworkError, match="127.0.0.1:9/generate: connection error"):
        run_probe(fixture(kind), prompts=prompts, steps=1, max_new_tokens=8, main_url="http://127.0.0.1:9",
                  progress=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_probe_matches_cpu_on_fixture(tmp_path):
    prompts = write_prompts(tmp_path, PROMPTS)
    cpu = run_probe(fixture("mimo"), prompts=prompts, steps=2, max_new_tokens=NEW, progress=False, dtype="fp32")
    gpu = run_probe(fixture("mimo"), device="cuda:0", prompts=prompts, steps=2, max_new_tokens=NEW,
                    progress=False, dtype="fp32")
    assert abs(cpu.alpha1 - gpu.alpha1) < 0.05
