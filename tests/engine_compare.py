"""The probe against vLLM on the same fixture and prompts: one record per (fixture, K, prompt).

The probe runs in-process, one prompt at a time (``run_probe``, greedy, CPU), and writes its greedy
continuation (``--save-continuations``); vLLM gets exactly those prompt token ids. vLLM's per-request
speculative record lists every verify step in order (accepted, drafted); the probe's verify walk
counts a step only when its whole window (K drafts + bonus) lies inside the text
(ckptinspect/probe/walk.py), so vLLM's steps are replayed from the prompt end and the same rule
picks the steps compared. Both histograms then count the same steps of the same text, whenever the
two greedy texts agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class PromptPair:
    kind: str
    k: int
    prompt: str
    prompt_ids: list[int]
    probe_tokens: list[int]  # the probe's greedy continuation (without the prompt)
    probe_hist: list[int]
    vllm_tokens: list[int] = field(default_factory=list)
    vllm_steps: list[tuple[int, int]] = field(default_factory=list)  # (accepted, drafted) per verify step
    vllm_hist: list[int] = field(default_factory=list)  # the steps inside the probe's window rule

    @property
    def same_text(self) -> bool:
        return self.probe_tokens == self.vllm_tokens

    def first_divergence(self) -> int | None:
        for i, (a, b) in enumerate(zip(self.probe_tokens, self.vllm_tokens)):
            if a != b:
                return i
        return None if len(self.probe_tokens) == len(self.vllm_tokens) else min(len(self.probe_tokens),
                                                                                 len(self.vllm_tokens))


def windowed_histogram(steps: list[tuple[int, int]], prompt_len: int, length: int, k: int) -> list[int]:
    """vLLM's ordered steps replayed from t = prompt_len - 1; kept where the probe's walk keeps a step."""
    hist = [0] * (k + 1)
    t = prompt_len - 1
    for accepted, drafted in steps:
        if t + k + 2 <= length - 1:
            assert drafted == k, f"a step inside the window drafted {drafted} of {k}"
            hist[accepted] += 1
        t += accepted + 1
    return hist


def probe_prompt(path: str, prompt: str, k: int, new_tokens: int, tmp) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, greedy continuation, walk histogram) of one prompt through the in-process probe."""
    from ckptinspect.probe.runner import run_probe
    from ckptinspect.render.probe_out import probe_json

    pfile = tmp / f"p{abs(hash((path, prompt))) % 10**8}.jsonl"
    pfile.write_text(json.dumps({"category": "t", "prompt": prompt}) + "\n", encoding="utf-8")
    cont = tmp / (pfile.stem + f"-k{k}.cont.jsonl")
    result = run_probe(path, prompts=str(pfile), steps=k, max_new_tokens=new_tokens, batch_size=1,
                       progress=False, save_continuations_to=str(cont))
    rows = [json.loads(line) for line in cont.read_text(encoding="utf-8").splitlines()[1:]]
    plen, tokens = rows[0]["prompt_len"], rows[0]["tokens"]
    hist = probe_json(result)["overall"]["histogram"]
    return tokens[:plen], tokens[plen:], hist


def attach_vllm(pair: PromptPair, output: dict) -> None:
    spec = output["spec"] or {}
    pair.vllm_tokens = list(output["token_ids"])
    pair.vllm_steps = list(zip(spec.get("per_step_accepted", []), spec.get("per_step_drafted", [])))
    length = len(pair.prompt_ids) + len(pair.vllm_tokens)
    pair.vllm_hist = windowed_histogram(pair.vllm_steps, len(pair.prompt_ids), length, pair.k)


def per_pos(hist: list[int]) -> list[int]:
    """Accepted drafts at each position (vLLM's spec_decode_num_accepted_tokens_per_pos)."""
    return [sum(hist[j + 1:]) for j in range(len(hist) - 1)]


# A flip counts as a near-tie when the probe's (fp32) top logit beats the token vLLM (bf16) took by
# less than this fraction of the position's largest |logit|. bf16 keeps 8 significant bits (relative
# step 2^-8 = 0.4%); a logit sums ~hidden_size bf16 products and passes through several bf16 layers,
# so its error is a few of those steps: 2^-5 (3.1%) of the logit scale bounds it with margin.
TIE_FRACTION = 2.0 ** -5


@dataclass
class Flip:
    where: str  # "target" (the greedy texts part) or "draft" (same text, a draft accepted by one side only)
    position: int  # index into the full token sequence of the token decided
    depth: int  # 0 for target, the draft depth otherwise
    margin: float  # probe's top logit minus the logit of the token the other side chose (>= 0)
    scale: float  # that position's largest |logit|

    @property
    def near_tie(self) -> bool:
        return self.margin <= TIE_FRACTION * self.scale


class ProbeLogits:
    """The probe's own main model and MTP head (fp32), exposing the logits behind each decision."""

    def __init__(self, path: str) -> None:
        from probe_helpers import load_main

        from ckptinspect.probe.heads.build import build_head

        self.main, spec = load_main(path)
        self.head = build_head(spec, self.main, path)

    def logits(self, tokens: list[int], k: int):
        """(target logits [N, V], draft logits [K, N-1, V]) over one sequence, through run_chain."""
        import torch

        from ckptinspect.probe.chain import run_chain
        from ckptinspect.probe.evaluate import target_hidden

        captured = []
        original = self.head.logits

        def record(out):
            res = original(out)
            captured.append(res.detach())
            return res

        self.head.logits = record
        try:
            with torch.no_grad():
                ids = torch.tensor([tokens])
                hidden = target_hidden(self.main, ids)
                target = self.main.get_output_embeddings()(hidden)[0].float()
                run_chain(self.head, ids, hidden, k)
        finally:
            del self.head.logits
        return target, torch.stack([c[0].float() for c in captured])


def explain(pair: PromptPair, probe: ProbeLogits) -> Flip | None:
    """The first decision where the probe and vLLM part, with the probe's margin there."""
    plen = len(pair.prompt_ids)
    d = pair.first_divergence()
    if d is not None:
        common = pair.prompt_ids + pair.probe_tokens[:d]
        if d >= len(pair.vllm_tokens) or d >= len(pair.probe_tokens):
            return Flip("target", plen + d, 0, float("inf"), 0.0)  # one side stopped: not a tie
        target, _ = probe.logits(common + [pair.probe_tokens[d]], 1)
        row = target[plen + d - 1]
        return Flip("target", plen + d, 0, float(row.max() - row[pair.vllm_tokens[d]]), float(row.abs().max()))
    tokens = pair.prompt_ids + pair.vllm_tokens
    _, drafts = probe.logits(tokens, pair.k)
    t = plen - 1
    for accepted, _ in pair.vllm_steps:
        if t + pair.k + 2 > len(tokens) - 1:
            break
        mine = 0
        while mine < pair.k and int(drafts[mine, t].argmax()) == tokens[t + mine + 2]:
            mine += 1
        if mine != accepted:
            depth = min(mine, accepted) + 1
            row = drafts[depth - 1, t]
            if accepted > mine:  # vLLM drafted the text's token where the probe drafted another
                other = row[tokens[t + depth + 1]]
            else:  # the probe drafted the text's token, vLLM another: its runner-up is the closest
                other = row.topk(2).values[1]
            return Flip("draft", t + depth + 1, depth, float(row.max() - other), float(row.abs().max()))
        t += accepted + 1
    return None


def near_tie_flip(pair: PromptPair, probe: ProbeLogits, where: str) -> Flip:
    """The first split of a prompt whose probe and engine runs differ (``explain``), asserted to be a
    near-tie: a decision within bf16 rounding of its runner-up. ``where`` names the prompt in the messages."""
    flip = explain(pair, probe)
    assert flip is not None, f"{where}: histograms differ but every decision agrees"
    assert flip.near_tie, (f"{where}: the probe and vLLM part at a decision the probe makes by "
                           f"{flip.margin:.4f} (over {TIE_FRACTION} x {flip.scale:.3f})")
    return flip
