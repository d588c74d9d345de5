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


# -- GGUF headers, files of repo ids, audit cache entries (fixtures/fuzzcase_inputs.py) ----------------
from fixtures.fuzzcase_inputs import AuditEntryFuzzer, GgufCorpus, gguf_case, ids_file_case  # noqa: E402


@pytest.fixture(scope="module")
def gguf_corpus(tmp_path_factory) -> GgufCorpus:
    pytest.importorskip("gguf")
    return GgufCorpus(tmp_path_factory.mktemp("gguf"))


@pytest.fixture(scope="module")
def audit_entries(tmp_path_factory) -> AuditEntryFuzzer:
    return AuditEntryFuzzer(tmp_path_factory.mktemp("audit"))


@settings(FAST, max_examples=400)
@given(rng=SEEDS)
def test_gguf_header_fuzz_is_accepted_or_one_line(gguf_corpus: GgufCorpus, rng: random.Random):
    outcome = gguf_case(gguf_corpus, rng)
    assert outcome.ok, f"{outcome.target} {outcome.status}: {outcome.detail}"


@settings(FAST, max_examples=150)
@given(rng=SEEDS)
def test_repos_file_fuzz_is_accepted_or_one_line(tmp_path_factory, rng: random.Random):
    outcome = ids_file_case(tmp_path_factory.getbasetemp(), rng)
    assert outcome.ok, f"{outcome.status}: {outcome.detail}"


@settings(FAST, max_examples=100)
@given(rng=SEEDS)
def test_a_changed_audit_cache_entry_is_a_miss_never_an_answer(audit_entries: AuditEntryFuzzer, rng: random.Random):
    outcome = audit_entries.case(rng)
    assert outcome.ok, f"{outcome.status}: {outcome.detail}"


def test_the_new_mutations_reach_both_answers(gguf_corpus: GgufCorpus, tmp_path):
    """GGUF and repos-file mutations are neither all fatal nor all harmless (fixed seeds)."""
    for run in (lambda r: gguf_case(gguf_corpus, r), lambda r: ids_file_case(tmp_path, r)):
        statuses: set[str] = set()
        for seed in range(200):
            statuses.add(run(random.Random(seed)).status)
            if statuses >= {"accepted", "rejected"}:
                break
        assert statuses == {"accepted", "rejected"}, statuses


# -- what servers send: the Hub listing, engine answers (fixtures/fuzzcase_net.py) ------------------------
from fixtures.fuzzcase_net import ENGINE_TARGETS, ListingServer, engine_case, listing_case  # noqa: E402


@settings(FAST, max_examples=300)
@given(rng=SEEDS)
def test_listing_page_fuzz_gives_hub_ids_or_one_line(rng: random.Random):
    outcome = listing_case(rng)
    assert outcome.ok, f"{outcome.target} {outcome.status}: {outcome.detail}"


@settings(FAST, max_examples=300)
@given(rng=SEEDS)
def test_engine_answer_fuzz_is_accepted_or_one_line(rng: random.Random):
    outcome = engine_case(rng)
    assert outcome.ok, f"{outcome.target} {outcome.status}: {outcome.detail}"


@pytest.fixture(scope="module")
def listing_server(tmp_path_factory):
    server = ListingServer(tmp_path_factory.mktemp("listing"))
    yield server
    server.close()


@settings(FAST, max_examples=25)  # each a whole audit (~0.2 s): the in-process listing cases are the many
@given(rng=SEEDS)
def test_audit_search_against_a_fuzzed_listing_server(listing_server: ListingServer, rng: random.Random):
    outcome = listing_server.case(rng)
    assert outcome.ok, f"{outcome.target} {outcome.status}: {outcome.detail}"


def test_the_server_answer_mutations_reach_both_answers(listing_server: ListingServer):
    """Listing pages, whole audits and every kind of engine answer are neither all refused nor all
    accepted (fixed seeds): a harness whose mutations broke every input would pass the other tests."""
    runs = {"listing": listing_case, "listing-e2e": listing_server.case}
    runs.update({t: (lambda r, t=t: engine_case(r, target=t)) for t in ENGINE_TARGETS})
    for name, run in runs.items():
        statuses: set[str] = set()
        for seed in range(80):
            statuses.add(run(random.Random(seed)).status)
            if statuses >= {"accepted", "rejected"}:
                break
        assert statuses == {"accepted", "rejected"}, (name, statuses)
