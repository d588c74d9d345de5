"""``--main-url`` self-check: the server's hidden states must give the server's own tokens."""

from __future__ import annotations

import pytest

from probe_helpers import fixture, write_prompts

from ckptinspect.errors import ProbeError
from ckptinspect.probe.runner import run_probe


def test_shifted_hidden_states_are_refused(tmp_path):
    from probe_server import ProbeTestServer

    prompts = write_prompts(tmp_path, ["explain check list", "write give solve"])
    # The same server with its rows correct passes the check (and is scored), shifted by one it fails.
    with ProbeTestServer(fixture("mimo")) as server:
        ok = run_probe(fixture("mimo"), prompts=prompts, steps=1, max_new_tokens=16, main_url=server.url,
                       progress=False)
    assert ok.overall.verify_steps() > 0
    with ProbeTestServer(fixture("mimo"), shift_hidden=True) as server:
        with pytest.raises(ProbeError, match=r"argmax\(lm_head\(h\)\) != next token"):
            run_probe(fixture("mimo"), prompts=prompts, steps=1, max_new_tokens=16, main_url=server.url,
                      progress=False)
