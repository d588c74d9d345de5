"""Regressions for what fuzzing the Hub listing and the engine answers found (issue 36,
fixtures/fuzzcase_net.py). Each test is the smallest input of one finding, through the function the
fuzzer reached it in; each failed before the fix (the exception or time noted)."""

from __future__ import annotations

import json
import time

import pytest

from ckptinspect.audit.select import MAX_LISTED, read_page
from ckptinspect.errors import CkptInspectError, NetworkError, ProbeError
from ckptinspect.probe import engine_client as ec

URL = "https://huggingface.co/api/models?search=x&expand=sha"
ORIGIN = ("https", "huggingface.co")
PAGE = json.dumps([{"_id": "0" * 24, "id": "org/model", "sha": "a" * 40}]).encode()
WHERE = "http://127.0.0.1:8000"
METRICS = ('vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
           'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0\n'
           'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0\n')


def _one_line(exc: CkptInspectError) -> str:
    text = str(exc)
    assert "\n" not in text and "\x1b" not in text
    return text


def test_a_link_header_with_a_malformed_url_is_one_error_line():
    # urljoin raised ValueError ("Invalid IPv6 URL") out of the listing
    for link in ('<http://[::1>; rel="next"', '<https://[zz]/x>; rel="next"'):
        with pytest.raises(NetworkError) as err:
            read_page(200, {"link": link}, PAGE, URL, "search=x", origin=ORIGIN, start=0)
        assert "Link header names no usable URL" in _one_line(err.value)


@pytest.mark.parametrize("headers, body", [
    ({}, b'["not", "an", "object"]'),  # huggingface_hub's data.get("error"): an AttributeError
    ({}, b'"a string"'),
    ({"x-error-code": "RepoNotFound", "link": "<https://huggingface.co/\u202e>"}, b"{}"),  # UnicodeEncodeError
    ({"x-error-code": "caf\u00e9"}, b'{"error": "x"}'),
])
def test_an_error_answer_huggingface_hub_cannot_read_is_one_error_line(headers, body):
    with pytest.raises(CkptInspectError) as err:
        read_page(404, headers, body, URL, "search=x", origin=ORIGIN, start=0)
    assert "\u202e" not in _one_line(err.value)


def test_a_listing_page_over_the_cap_is_refused_before_its_ids_are_checked():
    # every id is invalid: checked first (as before), the error would name entry 1; the page's size
    # alone refuses it, without MAX_LISTED id validations (~2M fit a 64 MB page: a minute of CPU)
    page = json.dumps([{"id": "../x"}] * (MAX_LISTED + 1)).encode()
    with pytest.raises(NetworkError, match=f"more than {MAX_LISTED:,} repos"):
        read_page(200, {}, page, URL, "search=x", origin=ORIGIN, start=0)
    with pytest.raises(NetworkError, match="entry 1 is not a repo id"):  # a page under the cap: the ids
        read_page(200, {}, json.dumps([{"id": "../x"}] * 3).encode(), URL, "search=x", origin=ORIGIN, start=0)


def test_a_long_label_set_parses_in_linear_time():
    # findall tried a label name at every position of a word run: 40,000 characters took 8 s
    line = 'vllm:spec_decode_num_drafts_total{' + "a" * 400_000 + ',engine="0"} 5.0\n'
    started = time.process_time()
    metrics = ec.parse_prometheus(line + METRICS)
    assert time.process_time() - started < 2.0  # linear: ~0.01 s; the quadratic scan: hours
    assert metrics["vllm:spec_decode_num_drafts_total"][0] == ({"engine": "0"}, 5.0)
    # the labels of real lines are what they were
    assert ec.parse_prometheus(METRICS)["vllm:spec_decode_num_accepted_tokens_per_pos_total"] == [
        ({"engine": "0", "model_name": "m", "position": "0"}, 7.0)]


@pytest.mark.parametrize("label", ["\u00b2", "\u2460", "\u0663"])
def test_a_position_label_of_non_ascii_digits_is_a_probe_error(label):
    # '²'.isdigit() is True and int('²') a ValueError
    body = METRICS.replace('position="0"', f'position="{label}"').encode()
    with pytest.raises(ProbeError, match="draft position label"):
        ec.counters_from_metrics(body, WHERE)


def test_more_accepted_than_drafted_in_a_step_is_a_probe_error():
    # the tally's histogram has k + 1 bins: an IndexError
    spec = {"num_spec_tokens": 3, "per_step_accepted": [5, 1], "per_step_drafted": [3, 3]}
    with pytest.raises(ProbeError, match="accepted 5 of 3 drafts"):
        ec.window_tally(spec, 3, 4, 20, WHERE)
    ok = ec.window_tally({**spec, "per_step_accepted": [3, 1]}, 3, 4, 20, WHERE)
    assert ok.histogram == [0, 1, 0, 1]


@pytest.mark.parametrize("meta", [
    ["hidden_states"],  # not an object: an AttributeError
    {"hidden_states": [[]]},  # rows of width 0
    {"hidden_states": [1.0, 2.0]},  # numbers, not rows
    {"hidden_states": [[[[1.0]]]]},  # rows of rows
    {"hidden_states": [[1e39, 0.0]]},  # finite JSON, inf as float32
    {"hidden_states": [[10 ** 400, 0.0]]},  # an integer past any float: torch's OverflowError
])
def test_hidden_states_that_are_not_finite_2d_rows_are_a_probe_error(meta):
    pytest.importorskip("torch")
    from ckptinspect.probe.server_client import hidden_rows

    with pytest.raises(ProbeError, match="equal-width rows of finite" if isinstance(meta, dict) else "no meta_info"):
        hidden_rows(meta, WHERE)
    assert hidden_rows({"hidden_states": [[[1.0, 2.0]], [3.0, 4.0]]}, WHERE).shape == (2, 2)


def test_per_position_counts_summed_past_2_53_are_a_probe_error():
    # each row below 2**53, their sum (two engines' rows of position 0) past it: was accepted as a count
    row = 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="%d",model_name="m",position="0"} 9007199254740000.0\n'
    with pytest.raises(ProbeError, match="not a count"):
        ec.counters_from_metrics((METRICS + row % 1 + row % 2).encode(), WHERE)
    assert ec.counters_from_metrics((METRICS + row % 1).encode(), WHERE)["per_pos"] == [9007199254740007]
