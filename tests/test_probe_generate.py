"""Greedy mode's generation (CKPTINSPECT_PROBE_GENERATE, Settings.probe_generate): the static KV cache
gives the eager (dynamic cache) run's greedy tokens, and a static cache the model refuses falls back to
eager visibly (the JSON's generate object and a warning), never silently."""

from __future__ import annotations

import pytest

from probe_helpers import fixture, torch, write_prompts

from ckptinspect.probe.runner import run_probe
from ckptinspect.render.probe_out import probe_json

PROMPTS = ["Write a function that adds two numbers.", "First check the chain, then the gears;",
           "Solve for x: 3x + 7 = 2x - 5 and explain every step of it"]


def _tokens(tmp_path, kind, generate, name):
    out = tmp_path / f"{name}.jsonl"
    doc = probe_json(run_probe(fixture(kind), prompts=write_prompts(tmp_path, PROMPTS), steps=2, mode="greedy",
                               max_new_tokens=12, progress=False, batch_size=2, generate=generate,
                               save_continuations_to=str(out)))
    return out.read_text().splitlines()[1:], doc


@pytest.mark.parametrize("kind", ["deepseek", "mimo", "qwen35moe"])
def test_static_cache_generates_the_eager_tokens(tmp_path, kind):
    eager, doc_e = _tokens(tmp_path, kind, "eager", "e")
    static, doc_s = _tokens(tmp_path, kind, "static", "s")
    assert doc_e["generate"] == {"requested": "eager", "used": "eager", "compiled": False, "note": None}
    assert doc_s["generate"]["requested"] == "static"
    assert static == eager  # the same greedy continuations, token for token
    if doc_s["generate"]["used"] == "static":
        # on CPU transformers does not compile the decode step: said, not hidden
        assert doc_s["generate"]["compiled"] is False and "without compile" in doc_s["generate"]["note"]
    else:
        assert "refused" in doc_s["generate"]["note"]
    assert doc_s["overall"]["depths"] == doc_e["overall"]["depths"]


def test_a_refused_static_cache_falls_back_visibly(tmp_path, monkeypatch):
    from transformers import GenerationMixin

    original = GenerationMixin.generate

    def refuse_static(self, *args, **kwargs):
        if kwargs.get("cache_implementation") == "static":
            raise ValueError("this model does not support the static cache")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", refuse_static)
    eager, _ = _tokens(tmp_path, "deepseek", "eager", "e")
    with pytest.warns(UserWarning, match="static KV cache / compile refused"):
        static, doc = _tokens(tmp_path, "deepseek", "static", "s")
    assert static == eager
    assert doc["generate"]["used"] == "eager" and "does not support the static cache" in doc["generate"]["note"]


def test_the_setting_reaches_the_probe(monkeypatch):
    from ckptinspect import api
    from ckptinspect.settings import Settings, SettingsError

    seen = {}
    monkeypatch.setattr("ckptinspect.probe.runner.run_probe",
                        lambda ref, options, **kw: seen.update(generate=options.generate))
    api.probe(fixture("mimo"), settings=Settings.from_environ({"CKPTINSPECT_PROBE_GENERATE": "static"}))
    assert seen["generate"] == "static"
    api.probe(fixture("mimo"), settings=Settings())
    assert seen["generate"] == "eager"
    # an option the caller gave wins over the setting
    api.probe(fixture("mimo"), api.ProbeOptions(generate="eager"),
              Settings.from_environ({"CKPTINSPECT_PROBE_GENERATE": "static"}))
    assert seen["generate"] == "eager"
    with pytest.raises(SettingsError, match="CKPTINSPECT_PROBE_GENERATE='compiled'"):
        Settings.from_environ({"CKPTINSPECT_PROBE_GENERATE": "compiled"})
