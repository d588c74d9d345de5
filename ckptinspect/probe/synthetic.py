"""The ``synthetic`` category: prompts made of token ids the way serving benchmarks make them.

vLLM ``vllm bench serve --dataset-name random`` (``vllm/benchmarks/datasets.py``
``RandomDataset.generate_token_sequence``) takes, per request i, a run of consecutive ids from the
tokenizer's non-special vocabulary starting at a random offset: ``allowed[(offset + i + j) % n]``
for j < input_len (default input length 1024), decodes it to text and sends that as the prompt.
SGLang's ``bench_serving --dataset-name random-ids`` (``sglang/benchmark/datasets/random.py``
``sample_random_requests`` with ``random_sample=False``) does the same over the whole vocabulary,
``(offset + i + j) % vocab_size``; its ``--dataset-name random`` instead repeats / truncates ShareGPT
conversation text to the input length, i.e. real text. Such an id run is no language: the model's
continuation of it is what a random-token benchmark's decode steps verify, and it is not the model's
behaviour on real traffic (docs/probe.md, "Why random-token benchmarks show no MTP gain").

Here the prompts are those id runs, fed as ids (no chat template, as the benchmarks send raw
completion prompts), with a fixed seed so runs are comparable.
"""

from __future__ import annotations

import numpy as np

from ckptinspect.probe.prompts import Prompt

CATEGORY = "synthetic"
DEFAULT_LEN = 1024  # vLLM RandomDataset.DEFAULT_INPUT_LEN and SGLang's --random-input-len default
DEFAULT_COUNT = 24
SEED = 0


def synthetic_prompts(vocab_size: int, special_ids, *, count: int = DEFAULT_COUNT, length: int = DEFAULT_LEN,
                      seed: int = SEED) -> list[Prompt]:
    """``count`` prompts of ``length`` ids: consecutive runs over the non-special vocabulary from a
    random offset (vLLM's RandomDataset layout)."""
    special = {int(i) for i in special_ids if i is not None}
    allowed = np.array([i for i in range(vocab_size) if i not in special], dtype=np.int64)
    rng = np.random.default_rng(seed)
    offsets = rng.integers(0, vocab_size, size=count)
    return [Prompt(CATEGORY, "", tuple(int(t) for t in allowed[(offsets[i] + i + np.arange(length)) % len(allowed)]))
            for i in range(count)]
