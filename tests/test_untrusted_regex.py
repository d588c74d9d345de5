"""Untrusted patterns (compressed-tensors ``re:`` ignore entries, GPTQ dynamic keys, globs, rule regexes)
run on RE2 in linear time with Python's answers (ckptinspect/safe_regex.py)."""

from __future__ import annotations

import fnmatch
import re
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptinspect import safe_regex
from ckptinspect.quant.declared import ExcludeMatcher, read_declared
from ckptinspect.safe_regex import UnsupportedPattern, compile_re2, translate, translate_glob


@pytest.fixture(scope="module")
def everything() -> str:
    """Every code point but the surrogates, as one string."""
    return "".join(chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF)


def _matcher(ignore: list[str]) -> ExcludeMatcher:
    declared, _ = read_declared({"quantization_config": {"quant_method": "compressed-tensors", "ignore": ignore}},
                                None)
    return ExcludeMatcher(declared)


def test_re2_imports_under_its_module_name():
    import re2

    assert re2.compile("a+").match("aaa") is not None


@pytest.mark.parametrize("pattern,name", [
    ("(a|a)*b", "a" * 5000),                  # an alternation under a star
    ("(a|aa)*c", "a" * 5000),
    ("((ab)*a)*c", "ab" * 2500),              # a starred group inside a starred group
    ("(x+x+)+y", "x" * 5000),
    (r"(.*\.)*mlp\.gate$", "model." * 2000),   # passes a "(...+)+" screen: no quantifier inside the group's text
    ("(a*)*$", "a" * 5000 + "!"),
])
def test_catastrophic_patterns_finish_quickly_with_pythons_answer(pattern, name):
    """Each of these takes Python's engine longer than the age of the universe on the name; RE2 answers
    in well under a second, and the answer is the one Python gives on a short name of the same shape."""
    m = _matcher([f"re:{pattern}"])
    assert m.findings == []
    got = m.is_excluded(name)  # Python's engine would never return (RE2 time: BENCHMARKS.md)
    short = name[:12] if not name.endswith("!") else name[:11] + "!"
    assert m.is_excluded(short) is (re.match(pattern, short) is not None)
    assert got is (re.match(pattern, short) is not None)  # the long and the short name agree for these shapes


def test_a_pattern_re2_cannot_evaluate_is_a_finding_not_a_hang():
    m = _matcher([r"re:(a+)\1$", r"re:(?=.*mtp).*", r"re:\bmtp", "re:.*lm_head"])
    assert [f.code for f in m.findings] == ["exclude-entry-skipped"] * 3
    assert all("not evaluated" in f.message for f in m.findings)
    assert m.is_excluded("a" * 10000 + "!") is False
    assert m.is_excluded("model.lm_head") is True  # the entries RE2 can evaluate still apply


def test_an_invalid_or_overlong_pattern_is_a_finding():
    m = _matcher(["re:(unclosed", "re:" + "a" * 2000])
    assert [f.code for f in m.findings] == ["exclude-entry-skipped"] * 2
    assert "invalid regex" in m.findings[0].message and "longer than 1000" in m.findings[1].message


@pytest.mark.parametrize("pattern,names", [
    (r"a$", ["a", "a\n", "a\n\n", "ab"]),      # Python's $ also matches before a final newline
    (r"a\Z", ["a", "a\n"]),
    (r"a{,2}b", ["b", "ab", "aab", "aaab", "a{,2}b"]),
    (r"\d+x", ["12x", "\u0663x", "x"]),        # ARABIC-INDIC DIGIT THREE is \d in Python
    (r"\w+$", ["abc", "\u00e9t\u00e9", "a-b", "\u4e2d\u6587"]),
    (r"a\sb", ["a b", "a\u00a0b", "a\u2003b", "a\x1cb", "a_b"]),
    (r"[\w.]+\.weight", ["model.\u00e9.weight", "model-x.weight"]),
    (r"[]a]+", ["]]a", "b"]),
    (r"[^]a]", ["]", "b"]),
    (r"(?i)LM_HEAD", ["lm_head", "Lm_Head"]),
    (r"(?s)a.b", ["a\nb"]),
    (r"a.b", ["a\nb", "axb"]),
    (r"\x41\u00e9", ["A\u00e9"]),
])
def test_translation_keeps_pythons_answers_on_tricky_syntax(pattern, names):
    compiled = compile_re2(translate(pattern))
    for name in names:
        assert (compiled.match(name) is not None) is (re.match(pattern, name) is not None), (pattern, name)


def test_the_whitespace_set_is_exactly_pythons_str_isspace(everything):
    """\\s is spelled out for RE2; check the set against every code point (Python's definition)."""
    found = set(compile_re2(translate(r"\s")).findall(everything))
    assert found == {c for c in everything if c.isspace()}
    assert compile_re2(translate(r"\S+")).sub("", everything) == "".join(c for c in everything if c.isspace())


@pytest.mark.parametrize("escape", [r"\w", r"\d"])
def test_word_and_digit_classes_differ_only_on_code_points_python_does_not_know(escape, everything):
    """\\w and \\d agree with Python on every code point its unicodedata assigns; RE2's newer Unicode tables
    add only letters and digits that are unassigned (Cn) for this Python (the documented residual)."""
    import unicodedata

    ours = set(compile_re2(translate(escape)).findall(everything))
    python = set(re.findall(escape, everything))
    assert python <= ours
    assert all(unicodedata.category(c) == "Cn" for c in ours - python)


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=a)", r"(?<=a)b", r"\bx", r"(?m)a$", r"(?x) a", r"[\W]", "a*+",
                                     "(?>a)", r"[[:alpha:]]", r"\N{DIGIT ONE}", r"(?a)\w"])
def test_unsupported_constructs_are_refused(pattern):
    with pytest.raises(UnsupportedPattern):
        compile_re2(translate(pattern))


# -- differential: RE2 (translated) vs Python re on generated safe patterns and names ----------------------
_ATOMS = st.sampled_from(["a", "b", "0", "1", ".", r"\.", r"\d", r"\w", r"\s", "[ab]", "[^a]", "[0-9]", "[a-c.]",
                          "_", "x", r"\W", r"\D", r"\S"])


def _regex() -> st.SearchStrategy[str]:
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, inner).map("".join),
            st.tuples(inner, inner).map(lambda t: f"(?:{t[0]}|{t[1]})"),
            st.tuples(inner, st.sampled_from(["*", "+", "?", "{2}", "{1,3}", "{,2}", "*?", "+?"])).map(
                lambda t: f"({t[0]}){t[1]}"),
        )

    body = st.recursive(_ATOMS, extend, max_leaves=8)
    return st.tuples(st.sampled_from(["", "^", r"\A"]), body, st.sampled_from(["", "$", r"\Z"])).map("".join)


_NAMES = st.text(alphabet=st.sampled_from(list("ab01._x \n") + ["\u00e9", "\u0663", "\u00a0", "-"]), max_size=12)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=_regex(), name=_NAMES)
def test_re2_and_python_re_agree_on_generated_patterns(pattern, name):
    expected = re.match(pattern, name) is not None
    assert safe_regex.match(pattern, name) is expected, (pattern, name)
    assert (compile_re2(translate(pattern)).search(name) is not None) is (re.search(pattern, name) is not None)


_GLOB_PARTS = st.sampled_from(["*", "?", "a", "b", ".", "0", "[ab]", "[!a]", "[0-9]", "mtp", "layers", "["])


@settings(max_examples=800, deadline=None)
@given(glob=st.lists(_GLOB_PARTS, min_size=1, max_size=6).map("".join),
       name=st.lists(st.sampled_from(list("ab0.m[\n") + ["mtp", "layers"]), max_size=6).map("".join))
def test_globs_agree_with_fnmatchcase(glob, name):
    try:
        compiled = compile_re2(f"(?:{translate_glob(glob)})\\z")
    except UnsupportedPattern:  # a set with other than name characters: a finding, checked below
        assert re.search(r"\[!?[^\]]*[\[*?]", glob), glob  # only sets holding "[", "*" or "?" are refused
        return
    assert (compiled.match(name) is not None) is fnmatch.fnmatchcase(name, glob), (glob, name)


@settings(max_examples=500, deadline=None)
@given(glob=st.lists(st.sampled_from(["*", "mtp", "layers", "0", "1", ".", "?"]), min_size=1, max_size=5).map("".join),
       name=st.lists(st.sampled_from(["mtp", "layers", "0", "1", "fc", "weight"]), min_size=1, max_size=5).map(".".join))
def test_glob_exclude_lists_cover_children_like_the_reference(glob, name):
    """ModelOpt / HF lists: an entry matches the module or a parent of it (vLLM / HF loaders)."""
    declared, _ = read_declared({"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8",
                                                         "ignore": [glob]}}, None)
    parents = [name[:i] for i, ch in enumerate(name) if ch == "."]
    expected = any(fnmatch.fnmatchcase(candidate, glob) for candidate in [name, *parents])
    assert ExcludeMatcher(declared).is_excluded(name) is expected


def test_plan_rules_have_no_name_regex_to_run():
    """Plan rules no longer match the typed name (issue 13 item 2), so no rule regex runs on it at all:
    the condition is refused by the engine schema and by the condition evaluator, never evaluated."""
    import copy

    import jsonschema

    from ckptinspect.errors import RuleError
    from ckptinspect.plan.rules import PlanFacts, engine_rules, holds, rules_root

    facts = PlanFacts(arch="x", quant="fp8", attention="mla", moe=True, interconnect="nvlink", spec=False,
                  goal="latency", model_type="x")
    with pytest.raises(RuleError, match="unknown plan rule condition 'name_regex'"):
        holds({"name_regex": "(a|a)*b"}, facts)
    rules = copy.deepcopy(engine_rules("sglang"))
    rules["parsers"][0]["when"]["name_regex"] = "(a|a)*b"
    import json as _json

    schema = _json.loads((rules_root() / "schema" / "engine.schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError, match="name_regex"):
        jsonschema.validate(rules, schema)


def test_rule_schema_patterns_on_re2_give_jsonschemas_errors():
    """The family schema's `pattern` keyword runs on RE2; on built-in rules and on values that break
    each kind of pattern, the errors are exactly the stock jsonschema validator's."""
    import json as _json

    import jsonschema
    import yaml

    from ckptinspect.readiness.loader import builtin_dir
    from ckptinspect.rules.documents import schema_path, validator as _validator

    stock = jsonschema.Draft202012Validator(_json.loads(schema_path().read_text()))
    ours = _validator()
    docs = [yaml.safe_load(p.read_text()) for p in sorted(builtin_dir().glob("*.yaml"))]
    broken = []
    for doc in docs[:6]:
        for key, value in (("id", "Bad-Id"), ("extends", "x y"), ("id", "a" * 3000 + "!")):
            broken.append({**doc, key: value})
        if isinstance(doc.get("mtp"), dict) and doc["mtp"].get("prefixes"):
            broken.append({**doc, "mtp": {**doc["mtp"], "prefixes": ["model.layers.{x}."]}})

    def errors(validator, doc):
        return sorted((tuple(map(str, e.absolute_path)), e.validator, e.message) for e in validator.iter_errors(doc))

    assert any(errors(stock, d) for d in broken)
    for doc in docs + broken:
        assert errors(ours, doc) == errors(stock, doc)


def _entrywise_reference(ignore: list[str]) -> tuple[list[str], object]:
    """The obviously-correct way: translate and compile every entry alone, keep those RE2 accepts."""
    skipped, kept = [], []
    for entry in ignore:
        try:
            part = f"(?:{translate(entry[3:])})"
            compile_re2(part)
        except UnsupportedPattern:
            skipped.append(entry)
            continue
        kept.append(part)
    return skipped, compile_re2("|".join(kept)) if kept else None


_ENTRY_POOL = ["re:.*lm_head", "re:model\\.layers\\.[0-9]+\\.mlp\\.gate$", "re:a{1001}", "re:(a{1000}){1000}",
               "re:(unclosed", r"re:(a+)\1", "re:.*mtp.*", "re:visual\\..*", "re:x{2,1000}y", "re:(?=x)y"]
_NAMES = ["model.lm_head", "model.layers.3.mlp.gate", "mtp.layers.0.fc", "visual.blocks.0.attn", "a" * 1001,
          "xxy", "y", "model.layers.3.mlp.gate.weight"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_ENTRY_POOL), max_size=8))
def test_union_first_compilation_equals_compiling_each_entry_alone(ignore):
    """ExcludeMatcher compiles the union of a list's entries once and only falls back to one compilation
    per entry when RE2 refuses the union; the skipped entries and every answer must be those of the
    entry-by-entry reference."""
    m = _matcher(ignore)
    skipped, reference = _entrywise_reference(ignore)
    got_skipped = [f.message.split("entry ", 1)[1].split(" not evaluated")[0] for f in m.findings]
    assert got_skipped == [repr(e[:80]) for e in skipped]
    for name in _NAMES:
        want = reference is not None and reference.match(name) is not None
        assert m.is_excluded(name) is want, (ignore, name)
