"""Exclude lists at hostile scale (issue 36): 100,000 compressed-tensors ``re:`` entries or ModelOpt
globs took ~61 s per command (every entry re-translated and re-compiled by Python for each of the 13
engine questions, and a 100,000-pattern RE2 set that never compiled, so never cached). Now: translations
are remembered, Python only parses (no compile), RE2 sets are chunked and cached (failures too), and a
list over MAX_LIST_PATTERNS is "not evaluated" (never guessed).

The speed-ups must keep every answer: hypothesis checks the chunked first-match lookups against
evaluating each pattern alone with Python's own ``re.match`` / ``fnmatch.fnmatchcase``, in list order,
and the parse-only validity check against ``re.compile``."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptinspect import safe_regex
from ckptinspect.safe_regex import UnsupportedPattern

ROOT = Path(__file__).resolve().parent.parent
SLOW_OK = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
                   database=None)

_PIECES = st.sampled_from(["a", "b", "0", r"\.", ".", ".*", "[ab]", r"\d", "x?", "(a|b)", "(?:ab)+", "$", "mtp",
                           "layers", r"\d+", "[", "(", ")", "{2}", "*", "(?i)", "(?=a)", r"\b", r"\1"])
_PATTERNS = st.lists(_PIECES, min_size=1, max_size=5).map("".join)
_NAME = st.lists(st.sampled_from(["a", "b", "0", "1", ".", "mtp", "layers", "A", "\n"]), max_size=6).map("".join)


def _python_first(name: str, patterns: list[str]) -> int | None:
    """The reference: each pattern alone, in order, on Python's own engine (first that re.matches)."""
    for i, pattern in enumerate(patterns):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if re.match(pattern, name):
                return i
    return None


def _python_valid(pattern: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            re.compile(pattern)
    except (re.error, OverflowError, RecursionError, ValueError):
        return False
    return True


@settings(SLOW_OK, max_examples=400)
@given(pattern=_PATTERNS)
def test_parsing_alone_rejects_exactly_what_compiling_rejects(pattern):
    try:
        safe_regex._python_parses(pattern)
        parses = True
    except (re.error, OverflowError, RecursionError, ValueError):
        parses = False
    assert parses is _python_valid(pattern), pattern


@settings(SLOW_OK, max_examples=400)
@given(patterns=st.lists(_PATTERNS, min_size=1, max_size=9), names=st.lists(_NAME, min_size=1, max_size=4),
       chunk=st.sampled_from([1, 2, 3, 2048]))
def test_chunked_first_match_equals_each_pattern_alone_in_order(monkeypatch_chunk, patterns, names, chunk):
    monkeypatch_chunk(chunk)
    valid = all(_python_valid(p) for p in patterns)
    for name in names:
        try:
            got = safe_regex.first_match_index(name, tuple(patterns))
        except UnsupportedPattern:
            # refused only when some pattern is invalid for Python or one RE2 cannot evaluate alike
            assert not valid or any(_re2_refuses(p) for p in patterns), patterns
            continue
        assert valid
        assert got == _python_first(name, patterns), (patterns, name)


def _re2_refuses(pattern: str) -> bool:
    try:
        safe_regex.compile_re2(safe_regex.translate(pattern))
    except UnsupportedPattern:
        return True
    return False


_GLOB = st.lists(st.sampled_from(["*", "?", "a", "b", ".", "0", "[ab]", "[!a]", "[0-9]", "mtp", "layers"]),
                 min_size=1, max_size=5).map("".join)


@settings(SLOW_OK, max_examples=400)
@given(globs=st.lists(_GLOB, min_size=1, max_size=9), names=st.lists(_NAME, min_size=1, max_size=4),
       chunk=st.sampled_from([1, 2, 3, 2048]))
def test_chunked_first_glob_match_equals_fnmatchcase_in_order(monkeypatch_chunk, globs, names, chunk):
    monkeypatch_chunk(chunk)
    for name in names:
        want = next((i for i, g in enumerate(globs) if fnmatch.fnmatchcase(name, g)), None)
        assert safe_regex.first_glob_match_index(name, tuple(globs)) == want, (globs, name)


@pytest.fixture()
def monkeypatch_chunk():
    old = safe_regex.SET_CHUNK

    def set_chunk(n: int) -> None:
        safe_regex.SET_CHUNK = n
        safe_regex._match_sets.cache_clear()

    yield set_chunk
    safe_regex.SET_CHUNK = old
    safe_regex._match_sets.cache_clear()


def test_a_list_over_the_cap_is_not_evaluated_never_guessed():
    bodies = tuple(f"model\\.x{i}" for i in range(safe_regex.MAX_LIST_PATTERNS + 1))
    with pytest.raises(UnsupportedPattern, match="over the 10,000 evaluated"):
        safe_regex.first_match_index("model.x1", bodies)
    assert safe_regex.first_match_index("model.x1", bodies[:safe_regex.MAX_LIST_PATTERNS]) == 1


# -- the CLI on 100,000-entry lists ----------------------------------------------------------------------
def _cpu_seconds_of(cmd: list[str], env: dict) -> tuple[subprocess.CompletedProcess, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@pytest.mark.parametrize("kind", ["ct-regex", "modelopt-glob"])
def test_100000_entry_exclude_lists_cost_about_a_second(make_fixture, tmp_path, kind):
    """CPU time, not wall time (the machine may be shared): the report of the same checkpoint with its
    list grown to 100,000 entries costs at most a few seconds more (main before this change: ~60 s)."""
    name = "qwen3_5_moe_ct_nvfp4" if kind == "ct-regex" else "qwen3_5_moe_nvfp4"
    src = make_fixture(name)
    big = tmp_path / "big"
    shutil.copytree(src, big)
    if kind == "ct-regex":
        cfg = json.loads((big / "config.json").read_text())
        cfg["quantization_config"]["ignore"] += [f"re:model\\.foo{i}\\.(bar|baz)\\d+" for i in range(100_000)]
        (big / "config.json").write_text(json.dumps(cfg))
    else:
        hq = json.loads((big / "hf_quant_config.json").read_text())
        hq["quantization"]["exclude_modules"] += [f"model.foo{i}.*bar*" for i in range(100_000)]
        (big / "hf_quant_config.json").write_text(json.dumps(hq))
    env = {k: v for k, v in os.environ.items() if k != "CKPTINSPECT_DEBUG"}
    cmd = [sys.executable, "-m", "ckptinspect", "report", "--format", "json"]
    base, base_cpu = _cpu_seconds_of(cmd + [str(src)], env)
    done, cpu = _cpu_seconds_of(cmd + [str(big)], env)
    assert base.returncode == 0 and done.returncode == 0, done.stderr[-2000:]
    codes = {f["code"] for f in json.loads(done.stdout)["findings"]}
    assert "exclude-list-too-long" in codes  # the entries past the cap are said to be unevaluated
    assert cpu - base_cpu < 6.0, (cpu, base_cpu)
