"""Shared helpers of the probe tests (fixture paths, model loading)."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "fixtures", "probe"))

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import build_fixtures  # noqa: E402


def fixture(kind: str) -> str:
    return build_fixtures.fixture_dir(kind)


def load_main(path: str):
    from ckptinspect.probe import loader
    from ckptinspect.probe.heads import find_spec

    config = loader.read_config(path)
    spec = find_spec(config)
    main = loader.load_main_model(path, config, main_model_type=spec.main_model_type, device_map={"": "cpu"},
                                  dtype=torch.float32, trust_remote_code=False)
    return main, spec


def chain_inputs(kind: str):
    """(MTP head, ids, hidden, target) of fixture ``kind``: 2 x 45 random token ids (seed 3), the main
    model's hidden states for them and the target-logits function ``run_chain`` takes; the one input
    the chain tests compare their paths on."""
    from ckptinspect.probe.evaluate import target_hidden
    from ckptinspect.probe.runner import build_head

    main, spec = load_main(fixture(kind))
    head = build_head(spec, main, fixture(kind))
    vocab = main.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (2, 45), generator=torch.Generator().manual_seed(3))
    hidden = target_hidden(main, ids)
    lm_head = main.get_output_embeddings()

    def target(start, end):
        return lm_head(hidden[:, start:end])

    return head, ids, hidden, target


def write_prompts(tmp_path, texts):
    import json

    p = tmp_path / "prompts.jsonl"
    p.write_text("\n".join(json.dumps({"category": "t", "prompt": t}) for t in texts) + "\n", encoding="utf-8")
    return str(p)


class LiveBytes:
    """Counts the bytes of tensor storages created inside it that are still alive, and their peak
    (a dispatch-mode hook on every op's outputs; a storage is counted once, freed when collected)."""

    def __init__(self):
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode

        self.live, self.peak, seen = 0, 0, set()
        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in torch.utils._pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        storage = t.untyped_storage()
                        key = storage.data_ptr()
                        if key in seen or storage.nbytes() == 0:
                            continue
                        seen.add(key)
                        counter.live += storage.nbytes()
                        counter.peak = max(counter.peak, counter.live)
                        weakref.finalize(storage, counter._free, key, storage.nbytes())
                return out

        self.mode = Mode()
        self._seen = seen

    def _free(self, key, nbytes):
        self._seen.discard(key)
        self.live -= nbytes

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)
