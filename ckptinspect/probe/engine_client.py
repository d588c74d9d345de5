"""``probe --engine sglang|vllm [--engine-url URL]``: draft acceptance as a running serving engine measures it.

The engine runs main model and MTP layer with its own kernels; we send the probe's prompts (greedy,
the checkpoint's own tokenizer and chat template, as token ids) and read back the engine's counts.

vLLM (OpenAI server, ``POST /v1/completions`` with token ids): a server started with
``--per-request-spec-decode-metrics detailed`` answers each request with
``metrics.speculative_decoding.per_step_accepted / per_step_drafted``, every verify step in order
(vllm/v1/metrics/stats.py RequestSpecDecodeMetrics, vllm/entrypoints/generate/base/protocol.py
SpeculativeDecodingMetrics, vLLM 0.32). Those steps are replayed from the prompt end and counted under
the in-process probe's window rule (ckptinspect/probe/walk.py: a step counts when its K drafts and
bonus lie inside the text), so both report the same steps of the same text. Without the per-request
record the aggregate Prometheus counters of ``/metrics`` are differenced around the run
(``vllm:spec_decode_num_drafts``, ``vllm:spec_decode_num_accepted_tokens_per_pos``; vllm/v1/metrics/
loggers.py): every verify step then counts, the cropped tail ones included (``counting`` says which).

SGLang (``POST /generate`` with ``input_ids``): ``meta_info.spec_correct_drafts_histogram`` (steps with
exactly n accepted drafts) and ``spec_verify_ct`` (sglang/srt/managers/tokenizer_manager.py, 0.5.23);
all verify steps count. Read from the source; no SGLang server runs in this project's tests.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from typing import Any, Sequence as Seq

from ckptinspect.errors import ProbeError
from ckptinspect.probe.metrics import DepthCounts, Tally

COUNTING_WINDOW = "per-request verify steps inside the probe's window"
COUNTING_ALL = "all verify steps"


def _http(url: str, payload: dict | None = None, timeout: float = 600.0) -> bytes:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read()
    except urllib.error.HTTPError as exc:
        raise ProbeError(f"engine answered HTTP {exc.code}: {exc.read()[:300]!r}", path=url) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise ProbeError(f"cannot reach the engine ({exc})", path=url) from exc


def _json(url: str, payload: dict | None = None) -> Any:
    body = _http(url, payload)
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        raise ProbeError("engine reply is not JSON", path=url) from exc


def detect(base: str) -> tuple[str, str, str | None]:
    """(engine kind, served model id, version) from ``/v1/models`` (``owned_by``) and ``/version``."""
    models = _json(base + "/v1/models")
    data = models.get("data") if isinstance(models, dict) else None
    if not data or not isinstance(data[0], dict) or "id" not in data[0]:
        raise ProbeError("/v1/models lists no served model", path=base)
    owner = str(data[0].get("owned_by", "")).lower()
    if owner not in ("vllm", "sglang"):
        raise ProbeError(f"the server's models are owned_by {owner!r}: --engine reads vLLM or SGLang", path=base)
    version = None
    try:
        info = _json(base + "/version")
        version = info.get("version") if isinstance(info, dict) else None
    except ProbeError:
        pass
    return owner, str(data[0]["id"]), version


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition -> {metric name: [(labels, value), ...]} (comments skipped)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
    for line in text.splitlines():
        m = line_re.match(line)
        if not m or line.startswith("#"):
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        try:
            out.setdefault(m.group(1), []).append((labels, float(m.group(4))))
        except ValueError:
            continue
    return out


def vllm_counters(base: str) -> dict[str, Any]:
    """num_drafts, num_draft_tokens and accepted per position, summed over engines and models."""
    metrics = parse_prometheus(_http(base + "/metrics").decode("utf-8", "replace"))

    def total(name: str) -> int:
        rows = metrics.get(name + "_total") or metrics.get(name) or []
        return int(sum(v for _, v in rows))

    per_pos: dict[int, int] = {}
    for name in ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "vllm:spec_decode_num_accepted_tokens_per_pos"):
        for labels, value in metrics.get(name, []):
            if "position" in labels:
                per_pos[int(labels["position"])] = per_pos.get(int(labels["position"]), 0) + int(value)
        if per_pos:
            break
    return {"num_drafts": total("vllm:spec_decode_num_drafts"),
            "num_draft_tokens": total("vllm:spec_decode_num_draft_tokens"),
            "per_pos": [per_pos.get(i, 0) for i in range(max(per_pos) + 1)] if per_pos else []}


def histogram_from_counters(before: dict, after: dict, k: int) -> list[int]:
    """Verify steps with exactly n accepted drafts, from differenced per-position counters."""
    drafts = after["num_drafts"] - before["num_drafts"]
    pos = [a - (before["per_pos"][i] if i < len(before["per_pos"]) else 0) for i, a in enumerate(after["per_pos"])]
    pos = (pos + [0] * k)[:k]
    hist = [drafts - (pos[0] if pos else 0)] + [pos[j - 1] - (pos[j] if j < k else 0) for j in range(1, k + 1)]
    if any(h < 0 for h in hist):
        raise ProbeError(f"inconsistent /metrics counters (drafts {drafts}, accepted per position {pos}): "
                         "another client was using the engine during the run?")
    return hist


def window_steps(steps: Seq[tuple[int, int]], prompt_len: int, length: int, k: int) -> list[int]:
    """Accepted drafts of the verify steps the in-process walk would count (walk.verify_walk's rule)."""
    kept, t = [], prompt_len - 1
    for accepted, drafted in steps:
        if t + k + 2 <= length - 1:
            if drafted != k:
                raise ProbeError(f"the engine drafted {drafted} tokens in a step inside the text, expected {k}")
            kept.append(int(accepted))
        t += int(accepted) + 1
    return kept


def tally_from_walk(k: int, per_step: Seq[int] | None, hist: Seq[int] | None, generated: int, seqs: int) -> Tally:
    """A Tally whose depth counts are the walk's own (an engine has no teacher-forced counts)."""
    tally = Tally(k)
    if per_step is not None:
        tally.add_walk(per_step)
    if hist is not None:
        tally.histogram = [a + int(b) for a, b in zip(tally.histogram, list(hist) + [0] * (k + 1))]
    steps = sum(tally.histogram)
    tally.depth = [DepthCounts(reached=sum(tally.histogram[j - 1:]), accepted=sum(tally.histogram[j:]), total=steps)
                   for j in range(1, k + 1)]
    tally.generated_tokens, tally.sequences = generated, seqs
    return tally


def _vllm_request(base: str, model_id: str, ids: list[int], max_new_tokens: int) -> tuple[list[int], dict | None]:
    reply = _json(base + "/v1/completions", {"model": model_id, "prompt": ids, "max_tokens": max_new_tokens,
                                            "temperature": 0.0, "return_token_ids": True})
    try:
        choice = reply["choices"][0]
        tokens = [int(t) for t in choice["token_ids"]]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ProbeError("vLLM completion reply has no choices[0].token_ids", path=base) from exc
    spec = (reply.get("metrics") or {}).get("speculative_decoding") if isinstance(reply.get("metrics"), dict) else None
    return tokens, spec


def _sglang_request(base: str, ids: list[int], max_new_tokens: int) -> tuple[list[int], dict]:
    reply = _json(base + "/generate", {"input_ids": ids, "sampling_params": {"temperature": 0.0,
                                                                            "max_new_tokens": max_new_tokens}})
    try:
        return [int(t) for t in reply["output_ids"]], dict(reply["meta_info"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProbeError("SGLang /generate reply has no output_ids / meta_info", path=base) from exc


def measure(base: str, encoded: Seq[tuple[str, list[int]]], max_new_tokens: int,
            steps: int | None) -> tuple[dict[str, Tally], dict[str, Any]]:
    """Per-category tallies and the ``engine`` record of one run over the encoded prompts."""
    base = base.rstrip("/")
    kind, model_id, version = detect(base)
    by_cat: dict[str, list] = {}
    info: dict[str, Any] = {"kind": kind, "version": version, "served_model": model_id}
    if kind == "vllm":
        before = vllm_counters(base)
        k, counting, rows = None, COUNTING_WINDOW, []
        for cat, ids in encoded:
            tokens, spec = _vllm_request(base, model_id, ids, max_new_tokens)
            rows.append((cat, ids, tokens, spec))
            if spec is None or "per_step_accepted" not in spec:
                counting = COUNTING_ALL
            elif k is None:
                k = int(spec["num_spec_tokens"])
        after = vllm_counters(base)
        k = k or len(after["per_pos"])
        if not k:
            raise ProbeError("the engine reports no speculative decoding (no spec_decode counters in /metrics): "
                             "start it with --speculative-config", path=base)
        if counting == COUNTING_WINDOW:
            for cat, ids, tokens, spec in rows:
                steps_ = list(zip(spec["per_step_accepted"], spec["per_step_drafted"]))
                kept = window_steps(steps_, len(ids), len(ids) + len(tokens), k)
                by_cat.setdefault(cat, []).append(tally_from_walk(k, kept, None, len(tokens), 1))
        else:
            hist = histogram_from_counters(before, after, k)
            tally = tally_from_walk(k, None, hist, sum(len(r[2]) for r in rows), len(rows))
            by_cat.setdefault("all", []).append(tally)
    else:
        k, counting = None, COUNTING_ALL
        for cat, ids in encoded:
            tokens, meta = _sglang_request(base, ids, max_new_tokens)
            hist = meta.get("spec_correct_drafts_histogram")
            if not isinstance(hist, list) or not meta.get("spec_verify_ct"):
                raise ProbeError("SGLang's reply has no spec_correct_drafts_histogram / spec_verify_ct: is the "
                                 "server running speculative decoding?", path=base)
            k = k or len(hist) - 1
            by_cat.setdefault(cat, []).append(tally_from_walk(k, None, hist, len(tokens), 1))
    if steps is not None and steps != k:
        raise ProbeError(f"the engine drafts {k} tokens per step, --steps says {steps}: restart the engine with "
                         f"{steps} speculative tokens or leave --steps out", path=base)
    tallies = {}
    for cat, parts in by_cat.items():
        tallies[cat] = Tally(k)
        for part in parts:
            tallies[cat].merge(part)
    info.update(num_speculative_tokens=k, counting=counting)
    return tallies, info


def run_engine(url: str, *, model: str, prompts: str | None = None, max_prompts: int | None = None,
               categories: Seq[str] | None = None, max_new_tokens: int = 128, steps: int | None = None,
               gpu: str = "H200", trust_remote_code: bool = False, temperature: float = 0.0,
               cost_calibration: str | None = None, kind: str | None = None, **_ignored: Any):
    """The probe's result record (ProbeResult) for acceptance measured by the engine at ``url`` (``kind``:
    the engine the user named, checked against what the server says it is). The cheap checks come first
    (the server answers, MODEL has a tokenizer) and only then are MODEL's headers read."""
    from ckptinspect.probe import loader
    from ckptinspect.probe.checkpoint import open_checkpoint
    from ckptinspect.probe.cost import DEFAULT_EFFICIENCY, load_efficiency
    from ckptinspect.probe.prompts import encode_prompt, load_prompts, load_tokenizer
    from ckptinspect.probe.readiness_gate import check_mtp_usable
    from ckptinspect.probe.result import build_result
    from ckptinspect.probe.runner import _spec, select_categories

    started = time.time()
    detected, _, _ = detect(url)  # a server that is not there fails here, in one request
    if kind is not None and detected != kind:
        raise ProbeError(f"--engine {kind}, but the server at this address is {detected}", path=url)
    model_dir = loader.resolve_model_dir(model)
    _require_tokenizer(model_dir)
    probe_ckpt = open_checkpoint(model_dir)
    spec = _spec(probe_ckpt)
    readiness = check_mtp_usable(probe_ckpt, spec, model_dir)
    vocab = probe_ckpt.checkpoint.config.vocab_size
    prompt_list = select_categories(load_prompts(prompts), categories, prompts or "the built-in prompt set")
    if max_prompts:
        prompt_list = prompt_list[:max_prompts]
    tok = load_tokenizer(model_dir, vocab, trust_remote_code=trust_remote_code)
    encoded = [(p.category, list(encode_prompt(tok, p, chat=True, vocab_size=vocab, source=model_dir)))
               for p in prompt_list]
    tallies, info = measure(url, encoded, max_new_tokens, steps)
    k = info["num_speculative_tokens"]
    efficiency = load_efficiency(cost_calibration) if cost_calibration else DEFAULT_EFFICIENCY
    return build_result(ref=model, probe_ckpt=probe_ckpt, spec=spec, mode="greedy", steps=k, temperature=temperature,
                        gpu=gpu, tallies=tallies, readiness=readiness, devices=[url], dtype="engine",
                        started=started, max_new_tokens=max_new_tokens, main_source=url, dequantized=False,
                        extra={"source": "engine", "engine": info}, efficiency=efficiency)


def _require_tokenizer(model_dir: str) -> None:
    """The prompts are tokenized with MODEL's own tokenizer: say so before any header is read."""
    import os

    from ckptinspect.records import TOKENIZER_FILES, has_tokenizer

    if not has_tokenizer(os.listdir(model_dir)):
        raise ProbeError(f"no tokenizer in the checkpoint (none of {', '.join(TOKENIZER_FILES)}): the prompts are "
                         "sent as the model's token ids, so MODEL must ship its tokenizer (the repo the server "
                         "serves does)", path=model_dir)
