"""Property-based fuzzing (hypothesis) with structural mutations of the real-layout example checkpoint.

fixtures/mutate.py edits anywhere in the parsed trees (tensor entries, config groups, nested text
configs, the weight map), not only top-level keys; fixtures/fuzzcase.py runs each case and classifies
it. The properties: no exception other than a one-line CkptInspectError, no case over its time bound,
the parser's fast path gives exactly the exact path's entries, `report` exits 0 or 2 (one error line)
and leaves the model directory bit-identical. A few thousand cases, well under a minute;
benchmarks/fuzz.py runs 100,000.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fixtures.fuzzcase import Corpus, ReportFuzzer, header_case, json_case  # noqa: E402

CORPUS = Corpus()
SEEDS = st.randoms(use_true_random=False)
FAST = settings(deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@settings(FAST, max_examples=1500)
@given(rng=SEEDS)
def test_parser_fuzz_fast_path_equals_exact_path(rng: random.Random):
    outcome = header_case(CORPUS, rng)
    assert outcome.ok, f"{outcome.status}: {outcome.detail}"


@settings(FAST, max_examples=600)
@given(rng=SEEDS)
def test_json_file_fuzz_is_accepted_or_one_line(rng: random.Random):
    outcome = json_case(CORPUS, rng)
    assert outcome.ok, f"{outcome.target} {outcome.status}: {outcome.detail}"


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory) -> ReportFuzzer:
    return ReportFuzzer(tmp_path_factory.mktemp("fuzz"), CORPUS)


@settings(FAST, max_examples=200)
@given(rng=SEEDS)
def test_report_fuzz_exit_0_or_2_and_model_dir_unchanged(fuzzer: ReportFuzzer, rng: random.Random):
    outcome = fuzzer.case(rng)
    assert outcome.ok, f"{outcome.target} {outcome.status}: {outcome.detail}"


def test_mutations_reach_both_answers(tmp_path):
    """The mutations are neither all fatal nor all harmless, for every kind of case (fixed seeds)."""
    fuzzer = ReportFuzzer(tmp_path, CORPUS)
    kinds = {"header": lambda r: header_case(CORPUS, r), "json": lambda r: json_case(CORPUS, r), "report": fuzzer.case}
    for kind, run in kinds.items():
        statuses: set[str] = set()
        for seed in range(60):  # stop at the first seed that shows both (the other tests check every status)
            statuses.add(run(random.Random(seed)).status)
            if statuses >= {"accepted", "rejected"}:
                break
        assert statuses == {"accepted", "rejected"}, (kind, statuses)
