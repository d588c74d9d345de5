"""ProbeOptions (ckptinspect/probe/options.py): the probe's options as one frozen record. Every keyword
run_probe took is a field, the runner and the engine client read only fields, the record is frozen and
checked when built, an unknown override is a TypeError, and the CLI and a library call with the same
options give the same result document."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import os
import subprocess
import sys

import pytest

from probe_helpers import ROOT, fixture, write_prompts

from ckptinspect import api
from ckptinspect.errors import ProbeError
from ckptinspect.probe import engine_client, runner
from ckptinspect.probe.options import ProbeOptions
from ckptinspect.render.probe_out import probe_json
from ckptinspect.settings import Settings

FIELDS = {f.name for f in dataclasses.fields(ProbeOptions)}
# run_probe's keywords before the options were one record (issue 35), and run_engine's own
RUN_PROBE_KEYWORDS = {
    "device", "devices", "prompts", "max_new_tokens", "steps", "mode", "temperature", "gpu", "trust_remote_code",
    "batch_size", "dtype", "progress", "main_url", "max_prompts", "corpus", "continuations",
    "save_continuations_to", "max_gpu_memory", "stream_chunk_tokens", "cost_calibration", "categories",
    "experts_implementation", "synthetic_len", "stream_store", "memory_limit", "host_memory_limit", "generate"}
ENGINE_KEYWORDS = {"engine", "engine_kind"}  # api.probe's routing: the URL and the named engine


def _reads(function, name: str) -> set[str]:
    """The attributes ``function`` reads off its local ``name``."""
    tree = ast.parse(inspect.getsource(function))
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == name}


def test_every_option_is_a_field_and_the_runners_read_only_fields():
    assert RUN_PROBE_KEYWORDS | ENGINE_KEYWORDS == FIELDS
    signature = inspect.signature(runner.run_probe)
    keywords = {n for n, p in signature.parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == {"settings", "head_factory"} and not keywords & FIELDS  # the hooks stay keywords
    options_reads = _reads(runner.run_probe, "o") - {"draft_steps", "sampling_temperature"}
    assert options_reads and options_reads <= FIELDS
    engine_reads = _reads(engine_client.run_engine, "options")
    assert engine_reads and engine_reads <= FIELDS
    assert all(field.type and field.default is not dataclasses.MISSING for field in dataclasses.fields(ProbeOptions))


def test_options_are_frozen_tuples_and_checked_when_built():
    options = ProbeOptions(devices=[0, 1], categories=["code", "math"])
    assert options.devices == (0, 1) and options.categories == ("code", "math")
    hash(options)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.steps = 2  # type: ignore[misc]
    assert options.draft_steps == 3 and options.sampling_temperature == 1.0  # the in-process defaults
    for bad, message in (({"mode": "beam"}, "unknown mode"), ({"steps": 17}, "between 1 and 16"),
                         ({"generate": "compiled"}, "unknown generate mode"),
                         ({"experts_implementation": "x"}, "unknown experts implementation"),
                         ({"corpus": "c.txt"}, "need --mode teacher"),
                         ({"corpus": "c", "continuations": "d", "mode": "teacher"}, "not both"),
                         ({"save_continuations_to": "s.jsonl", "mode": "teacher"}, "needs --mode greedy"),
                         ({"engine": "http://e", "mode": "teacher"}, "--engine measures greedy"),
                         ({"engine": "http://e", "main_url": "http://m"}, "--engine measures greedy")):
        with pytest.raises(ProbeError, match=message):
            ProbeOptions(**bad)
        with pytest.raises(ProbeError, match=message):  # a variant is checked again
            dataclasses.replace(ProbeOptions(), **bad)
    # the engine reads none of the in-process options: they are not judged there (as before)
    assert ProbeOptions(engine="http://e", corpus="c.txt", steps=40).steps == 40


def test_an_unknown_option_is_a_type_error_before_anything_is_read(tmp_path):
    with pytest.raises(TypeError, match="no_such_option"):
        runner.run_probe(str(tmp_path / "missing"), no_such_option=1)
    with pytest.raises(TypeError, match="options is a ProbeOptions, not Settings"):
        api.probe(fixture("mimo"), Settings())  # type: ignore[arg-type]
    with pytest.raises(ProbeError, match="in process"):
        runner.run_probe(fixture("mimo"), ProbeOptions(engine="http://127.0.0.1:9"))


def test_settings_fill_in_only_what_the_options_leave_unset(monkeypatch):
    seen = []
    monkeypatch.setattr("ckptinspect.probe.runner.run_probe", lambda ref, options, **kw: seen.append(options))
    settings = Settings.from_environ({"CKPTINSPECT_PROBE_MEMORY_LIMIT": "1000"})
    api.probe(fixture("mimo"), ProbeOptions(steps=2), settings)
    api.probe(fixture("mimo"), ProbeOptions(memory_limit=5), settings)
    assert [o.memory_limit for o in seen] == [1000, 5] and seen[0].steps == 2


def _stable(doc: dict) -> dict:
    """The result document without what differs run to run (wall times)."""
    return {k: v for k, v in doc.items() if k not in ("elapsed_s", "timings_s")}


def test_the_cli_and_the_library_give_the_same_result(tmp_path):
    prompts = write_prompts(tmp_path, ["The capital of France is", "def fib(n):"])
    # one memory figure for both (the free memory measured moves between runs; the batch source quotes it)
    env = {**os.environ, "CKPTINSPECT_PROBE_MEMORY_LIMIT": str(8 << 30)}
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "probe", fixture("mimo"), "--device", "cpu",
                           "--prompts", prompts, "--max-new-tokens", "16", "--steps", "2", "--format", "json",
                           "-q"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    options = ProbeOptions(device="cpu", prompts=prompts, max_new_tokens=16, steps=2, progress=False)
    result = api.probe(fixture("mimo"), options, Settings.from_environ(env))
    assert "8.0 GiB" in result.extra["batch_size_source"]
    assert _stable(json.loads(proc.stdout)) == _stable(json.loads(json.dumps(probe_json(result))))
