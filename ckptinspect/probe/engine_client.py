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

import math
import re
import time
from typing import TYPE_CHECKING, Any, Sequence as Seq

from ckptinspect.errors import ProbeError
from ckptinspect.probe.metrics import DepthCounts, Tally

if TYPE_CHECKING:
    from ckptinspect.probe.options import ProbeOptions

COUNTING_WINDOW = "per-request verify steps inside the probe's window"
COUNTING_ALL = "all verify steps"
# Every request goes through the one bounded network client (sources/hub_session.py ServerClient): the
# command's deadline (--deadline, CKPTINSPECT_DEADLINE_S) for each request, the byte budget for the run,
# and these caps on one answer. A Prometheus page of a real server is ~100 KB; a completion
# reply of a few thousand token ids with per-step records is a few hundred KB.
MAX_METRICS_BYTES = 16 << 20
MAX_REPLY_BYTES = 64 << 20
# Drafts per verify step: engines run 1-16 speculative tokens; a position label or a count past this is
# not a draft position of any engine (and would size the tallies).
MAX_SPEC_TOKENS = 64
# Counters are exact integers below 2**53 as Prometheus floats; past it (or NaN, Inf, negative) they are
# not counts of anything this run did.
MAX_COUNTER = float(2 ** 53)


def _client(base: str, settings: Any = None) -> Any:
    """The bounded client for the engine at ``base``; ``settings`` (ckptinspect/settings.py): the command's
    deadline and byte budget, as api.probe read them at the edge (None: the defaults)."""
    from ckptinspect.settings import DEFAULTS
    from ckptinspect.sources.hub_session import ServerClient

    return ServerClient(base, "engine", settings if settings is not None else DEFAULTS)


def _json(client: Any, path: str, payload: dict | None = None) -> Any:
    if payload is None:
        return client.get_json(path, MAX_REPLY_BYTES)
    return client.post_json(path, payload, MAX_REPLY_BYTES)


def detect(base: Any, settings: Any = None) -> tuple[str, str, str | None]:
    """(engine kind, served model id, version) from ``/v1/models`` (``owned_by``) and ``/version``."""
    from ckptinspect.errors import CkptInspectError

    client = _client(base, settings) if isinstance(base, str) else base
    owner, model_id = served_model(_json(client, "/v1/models"), client.shown)
    version = None
    try:
        info = _json(client, "/version")
        version = info.get("version") if isinstance(info, dict) and isinstance(info.get("version"), str) else None
    except CkptInspectError:
        pass
    return owner, model_id, version


def served_model(models: Any, where: str) -> tuple[str, str]:
    """(engine kind, served model id) of a decoded ``/v1/models`` answer; anything else is one ProbeError."""
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict) or not isinstance(data[0].get("id"), str):
        raise ProbeError("/v1/models lists no served model", path=where)
    owner = data[0].get("owned_by", "")
    owner = owner.lower() if isinstance(owner, str) else type(owner).__name__  # str() of a deep value is not shown
    if owner not in ("vllm", "sglang"):
        raise ProbeError(f"the server's models are owned_by {owner[:40]!r}: --engine reads vLLM or SGLang", path=where)
    return owner, data[0]["id"][:200]


_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
# The lookbehind starts a label name only at the start of a word: without it, findall tried every position
# of a long word run and backtracked over the rest of it (quadratic: 40,000 characters inside one label
# set took 8 s, and /metrics may be 16 MB).
_LABEL = re.compile(r'(?<!\w)(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition -> {metric name: [(labels, value), ...]} (comments skipped)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or line.startswith("#"):
            continue
        labels = dict(_LABEL.findall(m.group(3) or ""))
        try:
            out.setdefault(m.group(1), []).append((labels, float(m.group(4))))
        except ValueError:
            continue
    return out


def _count(value: float, what: str, where: str) -> int:
    """A counter's value as the count it is; NaN, Inf, negative or past 2**53 is one error line."""
    if not (math.isfinite(value) and 0 <= value < MAX_COUNTER):
        raise ProbeError(f"/metrics counter {what} is {value!r}, not a count", path=where)
    return int(value)


def _position(label: str, where: str) -> int:
    # ASCII digits only: str.isdigit() is also true of '²' or '①', which int() refuses (a ValueError)
    if not (label.isascii() and label.isdigit() and len(label) <= 3 and int(label) < MAX_SPEC_TOKENS):
        raise ProbeError(f"/metrics has a draft position label {label[:40]!r}, not a position below "
                         f"{MAX_SPEC_TOKENS}", path=where)
    return int(label)


def vllm_counters(base: Any) -> dict[str, Any]:
    """num_drafts, num_draft_tokens and accepted per position, summed over engines and models."""
    client = _client(base) if isinstance(base, str) else base
    return counters_from_metrics(client.get("/metrics", MAX_METRICS_BYTES), f"{client.shown}/metrics")


def counters_from_metrics(body: bytes, where: str) -> dict[str, Any]:
    """vllm_counters' answer from the ``/metrics`` body itself (no I/O: benchmarks/fuzz.py feeds it)."""
    metrics = parse_prometheus(body.decode("utf-8", "replace"))

    def total(name: str) -> int:
        rows = metrics.get(name + "_total") or metrics.get(name) or []
        return _count(sum(_count(v, name, where) for _, v in rows), name, where)

    per_pos: dict[int, int] = {}
    for name in ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "vllm:spec_decode_num_accepted_tokens_per_pos"):
        for labels, value in metrics.get(name, []):
            if "position" in labels:
                pos = _position(labels["position"], where)
                # the sum checked too, as total() checks its own: two rows of one position (two engines, a
                # repeated line) each below 2**53 could add up past it
                per_pos[pos] = _count(per_pos.get(pos, 0) + _count(value, name, where), name, where)
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
            if accepted > drafted:  # was an IndexError in the tally (a histogram of k + 1 bins)
                raise ProbeError(f"the engine accepted {accepted} of {drafted} drafts in one verify step")
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


def _vllm_request(base: Any, model_id: str, ids: list[int], max_new_tokens: int) -> tuple[list[int], dict | None]:
    client = _client(base) if isinstance(base, str) else base
    reply = _json(client, "/v1/completions", {"model": model_id, "prompt": ids, "max_tokens": max_new_tokens,
                                              "temperature": 0.0, "return_token_ids": True})
    return vllm_reply(reply, client.shown)


def vllm_reply(reply: Any, where: str) -> tuple[list[int], dict | None]:
    """(token ids, the per-request speculative decoding record or None) of a decoded completion reply."""
    try:
        choice = reply["choices"][0]
        tokens = [_token(t) for t in choice["token_ids"]]
    except (KeyError, IndexError, TypeError, ValueError):
        raise ProbeError("vLLM completion reply has no choices[0].token_ids", path=where) from None
    spec = (reply.get("metrics") or {}).get("speculative_decoding") if isinstance(reply.get("metrics"), dict) else None
    if spec is not None and not isinstance(spec, dict):
        raise ProbeError("vLLM completion reply's metrics.speculative_decoding is not an object", path=where)
    return tokens, spec


def _sglang_request(base: Any, ids: list[int], max_new_tokens: int) -> tuple[list[int], dict]:
    client = _client(base) if isinstance(base, str) else base
    reply = _json(client, "/generate", {"input_ids": ids, "sampling_params": {"temperature": 0.0,
                                                                             "max_new_tokens": max_new_tokens}})
    return sglang_reply(reply, client.shown)


def sglang_reply(reply: Any, where: str) -> tuple[list[int], dict]:
    """(token ids, meta_info) of a decoded SGLang ``/generate`` reply."""
    try:
        return [_token(t) for t in reply["output_ids"]], dict(reply["meta_info"])
    except (KeyError, TypeError, ValueError):
        raise ProbeError("SGLang /generate reply has no output_ids / meta_info", path=where) from None


def sglang_histogram(meta: dict, where: str) -> list[int]:
    """``spec_correct_drafts_histogram`` of a reply's meta_info: steps with exactly n accepted drafts."""
    hist = meta.get("spec_correct_drafts_histogram")
    if not isinstance(hist, list) or not meta.get("spec_verify_ct"):
        raise ProbeError("SGLang's reply has no spec_correct_drafts_histogram / spec_verify_ct: is the "
                         "server running speculative decoding?", path=where)
    if not 2 <= len(hist) <= MAX_SPEC_TOKENS + 1 or not all(type(h) is int and 0 <= h < MAX_COUNTER for h in hist):
        raise ProbeError("SGLang's spec_correct_drafts_histogram is not a list of counts for 1 to "
                         f"{MAX_SPEC_TOKENS} drafts", path=where)
    return hist


def _token(value: Any) -> int:
    """A token id as an engine sends it: a JSON integer (a float, a string or a bool is not one)."""
    if type(value) is not int or not 0 <= value < 2 ** 31:
        raise ValueError(f"token id {str(value)[:20]!r}")
    return value


def _steps(value: Any, k: int | None, where: str) -> list[int]:
    """A per-step list of counts of the reply (``per_step_accepted`` / ``per_step_drafted``)."""
    if not isinstance(value, list) or not all(type(v) is int and 0 <= v <= MAX_SPEC_TOKENS for v in value):
        raise ProbeError(f"the engine's per-step record is not a list of counts up to {MAX_SPEC_TOKENS}", path=where)
    return value


def spec_tokens(spec: dict, where: str) -> int:
    """``num_spec_tokens`` of a reply's speculative decoding record: drafts per verify step."""
    k = spec.get("num_spec_tokens")
    if type(k) is not int or not 1 <= k <= MAX_SPEC_TOKENS:
        raise ProbeError(f"the engine says num_spec_tokens = {str(k)[:20]!r}, not 1 to {MAX_SPEC_TOKENS}", path=where)
    return k


def window_tally(spec: dict, k: int, prompt_len: int, generated: int, where: str) -> Tally:
    """One request's tally from its per-step record, counted under the probe's window rule."""
    steps = list(zip(_steps(spec.get("per_step_accepted"), k, where), _steps(spec.get("per_step_drafted"), k, where)))
    kept = window_steps(steps, prompt_len, prompt_len + generated, k)
    return tally_from_walk(k, kept, None, generated, 1)


def measure(base: str, encoded: Seq[tuple[str, list[int]]], max_new_tokens: int,
            steps: int | None, settings: Any = None) -> tuple[dict[str, Tally], dict[str, Any]]:
    """Per-category tallies and the ``engine`` record of one run over the encoded prompts; every request
    of the run through one client (one byte budget)."""
    client = _client(base, settings)
    where = client.shown
    kind, model_id, version = detect(client)
    by_cat: dict[str, list] = {}
    info: dict[str, Any] = {"kind": kind, "version": version, "served_model": model_id}
    if kind == "vllm":
        before = vllm_counters(client)
        k, counting, rows = None, COUNTING_WINDOW, []
        for cat, ids in encoded:
            tokens, spec = _vllm_request(client, model_id, ids, max_new_tokens)
            rows.append((cat, ids, tokens, spec))
            if spec is None or "per_step_accepted" not in spec:
                counting = COUNTING_ALL
            elif k is None:
                k = spec_tokens(spec, where)
        after = vllm_counters(client)
        k = k or len(after["per_pos"])
        if not k:
            raise ProbeError("the engine reports no speculative decoding (no spec_decode counters in /metrics): "
                             "start it with --speculative-config", path=where)
        if counting == COUNTING_WINDOW:
            for cat, ids, tokens, spec in rows:
                by_cat.setdefault(cat, []).append(window_tally(spec, k, len(ids), len(tokens), where))
        else:
            hist = histogram_from_counters(before, after, k)
            tally = tally_from_walk(k, None, hist, sum(len(r[2]) for r in rows), len(rows))
            by_cat.setdefault("all", []).append(tally)
    else:
        k, counting = None, COUNTING_ALL
        for cat, ids in encoded:
            tokens, meta = _sglang_request(client, ids, max_new_tokens)
            hist = sglang_histogram(meta, where)
            k = k or len(hist) - 1
            by_cat.setdefault(cat, []).append(tally_from_walk(k, None, hist, len(tokens), 1))
    if steps is not None and steps != k:
        raise ProbeError(f"the engine drafts {k} tokens per step, --steps says {steps}: restart the engine with "
                         f"{steps} speculative tokens or leave --steps out", path=where)
    tallies = {}
    for cat, parts in by_cat.items():
        tallies[cat] = Tally(k)
        for part in parts:
            tallies[cat].merge(part)
    info.update(num_speculative_tokens=k, counting=counting)
    return tallies, info


def run_engine(model: str, options: "ProbeOptions", *, settings: Any = None):
    """The probe's result record (ProbeResult) for acceptance measured by the engine at ``options.engine``
    (``options.engine_kind``: the engine the user named, checked against what the server says it is). Of
    the options it reads the prompts (``prompts``, ``categories``, ``max_prompts``), ``max_new_tokens``,
    ``steps`` (None: the server's K), ``temperature`` (None: 0.0, greedy), ``trust_remote_code``, ``gpu`` and
    ``cost_calibration``. The cheap checks come first (the server answers, MODEL has a tokenizer) and only
    then are MODEL's headers read."""
    from ckptinspect.probe import loader
    from ckptinspect.probe.checkpoint import open_checkpoint
    from ckptinspect.probe.cost import DEFAULT_EFFICIENCY, load_efficiency
    from ckptinspect.probe.prompts import encode_prompt, load_prompts, load_tokenizer
    from ckptinspect.probe.readiness_gate import check_mtp_usable
    from ckptinspect.probe.result import build_result
    from ckptinspect.probe.runner import _spec, select_categories

    url, kind = options.engine or "", options.engine_kind
    temperature = 0.0 if options.temperature is None else options.temperature
    started = time.time()
    detected, _, _ = detect(url, settings)  # a server that is not there fails here, in one request
    if kind is not None and detected != kind:
        raise ProbeError(f"--engine {kind}, but the server at this address is {detected}", path=url)
    model_dir = loader.resolve_model_dir(model)
    _require_tokenizer(model_dir)
    probe_ckpt = open_checkpoint(model_dir)
    spec = _spec(probe_ckpt)
    readiness = check_mtp_usable(probe_ckpt, spec, model_dir)
    vocab = probe_ckpt.checkpoint.config.vocab_size
    prompt_list = select_categories(load_prompts(options.prompts), options.categories,
                                    options.prompts or "the built-in prompt set")
    if options.max_prompts:
        prompt_list = prompt_list[:options.max_prompts]
    tok = load_tokenizer(model_dir, vocab, trust_remote_code=options.trust_remote_code)
    encoded = [(p.category, list(encode_prompt(tok, p, chat=True, vocab_size=vocab, source=model_dir)))
               for p in prompt_list]
    from ckptinspect.sources.redact import redact_url

    tallies, info = measure(url, encoded, options.max_new_tokens, options.steps, settings)
    url = redact_url(url.rstrip("/"))  # what the result records: never the URL's password
    k = info["num_speculative_tokens"]
    efficiency = load_efficiency(options.cost_calibration) if options.cost_calibration else DEFAULT_EFFICIENCY
    return build_result(ref=model, probe_ckpt=probe_ckpt, spec=spec, mode="greedy", steps=k, temperature=temperature,
                        gpu=options.gpu, tallies=tallies, readiness=readiness, devices=[url], dtype="engine",
                        started=started, max_new_tokens=options.max_new_tokens, main_source=url, dequantized=False,
                        extra={"source": "engine", "engine": info}, efficiency=efficiency)


def _require_tokenizer(model_dir: str) -> None:
    """The prompts are tokenized with MODEL's own tokenizer: say so before any header is read."""
    import os

    from ckptinspect.records import TOKENIZER_FILES, has_tokenizer

    if not has_tokenizer(os.listdir(model_dir)):
        raise ProbeError(f"no tokenizer in the checkpoint (none of {', '.join(TOKENIZER_FILES)}): the prompts are "
                         "sent as the model's token ids, so MODEL must ship its tokenizer (the repo the server "
                         "serves does)", path=model_dir)
