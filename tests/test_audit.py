"""`ckptinspect audit` end to end through the test Hub server (tests/hub_server.py, its listing in
tests/hub_listing.py): >= 20 generated repos of mixed formats, some broken, one gated, one that times
out, one missing; each row must be exactly what that repo's own `report` says. Then the cache (a re-run
reads only what changed, a damaged entry is never believed) and the bound on requests in flight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf  # noqa: E402
from hub_server import HubServer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BASE = "base-org/Big-MoE"
TAG = f"base_model:quantized:{BASE}"
GOOD = ("qwen3_5_moe_nvfp4", "qwen3_5_moe_nvfp4_fused", "qwen3_5_moe_ct_nvfp4", "qwen3_5_moe_nvfp4_nomtp",
        "qwen3_5_moe_mtp_incomplete", "qwen3_5_moe_mtp_partial_quant", "deepseek_v3_fp8", "deepseek_v3_nvfp4",
        "deepseek_v3_nvfp4_nomtp", "deepseek_v3_depth_mismatch", "glm4_moe", "mimo_7b", "gpt_oss_mxfp4",
        "llama_bf16", "llama_awq", "llama_gptq", "qwen3_5_moe_gptq_int4_bf16_mtp")
BROKEN = ("broken_truncated_header", "broken_config_json", "broken_missing_shard", "with_pickle",
          "broken_shape_bytes_mismatch")
GATED, SLOW, MISSING = "org/gated-quant", "org/slow-quant", "org/deleted-quant"
# One repo's Hub read gives up on a silent server within seconds (the slow repo's answers take 4 s).
NET_ENV = {"HF_HUB_DOWNLOAD_TIMEOUT": "1", "CKPTINSPECT_REQUEST_TIMEOUT_S": "2", "CKPTINSPECT_RETRY_WAIT_S": "1",
           "CKPTINSPECT_DEADLINE_S": "120"}

# All the repos' own reports, one `report` after another in a process of their own.
OWN_REPORTS = """
import json, sys
from ckptinspect import api
from ckptinspect.render.report import render_report
out = {}
for repo in sys.argv[1:]:
    try:
        out[repo] = {"doc": json.loads(render_report(api.inspect(repo, progress=False), "json"))}
    except Exception as exc:
        out[repo] = {"error": type(exc).__name__, "message": str(exc)}
print(json.dumps(out))
"""


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    isolate_hf(monkeypatch, tmp_path / "hf_home")
    monkeypatch.setenv("CKPTINSPECT_CACHE_DIR", str(tmp_path / "ckcache"))
    for key, value in NET_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture()
def hub(make_fixture, tmp_path):
    with HubServer() as srv:
        for name in GOOD + BROKEN:
            srv.add_repo(f"org/{name}", make_fixture(name), tags=(TAG,))
        srv.add_repo(GATED, make_fixture("qwen3_5_moe_nvfp4"), gated_token="hf_secret", tags=(TAG,))
        srv.add_repo(SLOW, make_fixture("deepseek_v3_fp8"), tags=(TAG,))
        srv.add_fault("timeout", path_contains=SLOW, delay_s=4.0)
        srv.listing_page_size = 10  # the listing takes three pages
        yield srv


def _env(server) -> dict:
    env = dict(os.environ)
    env.pop("CKPTINSPECT_DEBUG", None)
    env["HF_ENDPOINT"] = server.url
    return env


def own_reports(server, repos) -> dict:
    done = subprocess.run([sys.executable, "-c", OWN_REPORTS, *repos], capture_output=True, text=True,
                          env=_env(server), cwd=str(ROOT), timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def run_audit(server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptinspect", "audit", *args], capture_output=True, text=True,
                          env=_env(server), cwd=str(ROOT), timeout=600)


def _strip(doc: dict) -> dict:
    doc = json.loads(json.dumps(doc))
    doc["source"].pop("stats", None)  # per-run request counts and timings
    return doc


def test_audit_rows_equal_each_repos_own_report(hub):
    done = run_audit(hub, MISSING, "--quantized-from", BASE, "--format", "json", "--full", "--fail-on", "unusable")
    assert done.returncode == 1, done.stderr  # unreadable repos trip --fail-on
    assert "fail-on unusable" in done.stderr
    assert "\r" not in done.stderr  # no progress line when stderr is not a terminal
    from ckptinspect.render.audit_out import validate_audit_json
    from ckptinspect.render.json_out import validate_report_json

    document = json.loads(done.stdout)
    validate_audit_json(document)
    rows = document["rows"]
    repos = [f"org/{n}" for n in GOOD + BROKEN] + [GATED, SLOW, MISSING]
    assert sorted(r["repo"] for r in rows) == sorted(repos) and len(rows) >= 20
    own = own_reports(hub, repos)
    for row in rows:
        mine = own[row["repo"]]
        if "error" in mine:
            assert row["status"] == "error", row["repo"]
            assert row["error"]["kind"] == mine["error"], (row["repo"], row["error"], mine)
            continue
        doc = _strip(mine["doc"])
        assert row["status"] == "ok", (row["repo"], row.get("error"))
        assert row["report"] == doc, row["repo"]
        validate_report_json(row["report"])
        # the columns are the report's own values
        assert row["revision"] == doc["source"]["revision"] == hub._repos[row["repo"]].commits["main"]
        assert row["verdict"] == doc["mtp"]["verdict"]
        assert row["declared"] == doc["quantization"]["declared"]
        assert row["bytes"] == doc["totals"]["bytes"]
        assert row["mtp"]["present_layers"] == doc["mtp"]["present_layers"]
        assert row["mtp"]["complete"] == doc["mtp"]["complete"]
        severities = {f["severity"] for f in doc["findings"]}
        worst = next((s for s in ("error", "warning", "info") if s in severities), None)
        assert (row["worst_finding"] or {}).get("severity") == worst
        assert row["error_findings"] == sum(f["severity"] == "error" for f in doc["findings"])
    kinds = {r["repo"]: r["error"]["kind"] for r in rows if r["status"] == "error"}
    assert kinds[GATED] == "AccessError" and kinds[MISSING] == "NotFoundError" and kinds[SLOW] == "NetworkError"
    assert kinds["org/broken_truncated_header"] == "HeaderError"
    # sorted: readable repos without error findings first, unreadable ones last
    tiers = [2 if r["status"] == "error" else (1 if r["error_findings"] else 0) for r in rows]
    assert tiers == sorted(tiers)


def test_cache_rereads_only_what_changed_and_never_believes_a_damaged_entry(hub, make_fixture, tmp_path,
                                                                            monkeypatch):
    from ckptinspect import api

    from ckptinspect.render.audit_out import row_json

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    # Off here so a re-read report shows on the wire as header reads (the Hub header cache would answer
    # them from disk; tests/test_hub_header_cache.py covers it).
    monkeypatch.setenv("CKPTINSPECT_HEADER_CACHE", "0")

    names = GOOD[:6]
    for name in names:
        hub.add_repo(f"cache/{name}", make_fixture(name), tags=("cache-set",))
    listing = api.audit_select(author="cache")
    assert len(listing) == len(names) and all(r.sha for r in listing)

    def audit() -> dict:
        return {r.repo: r for r in api.audit(listing, jobs=3)}

    first = audit()
    assert not any(r.cached for r in first.values()) and all(r.ok for r in first.values())
    hub.reset_stats()
    second = audit()
    assert all(r.cached for r in second.values())
    assert hub.stats()["requests"] == 0  # the listing's commits say nothing changed: nothing is read
    for repo, row in second.items():
        assert {**row_json(row, full=True), "cached": False} == row_json(first[repo], full=True)

    # An explicit id (no commit from a listing): one repo-info call asks for the commit, nothing else.
    hub.reset_stats()
    explicit = list(api.audit([f"cache/{names[3]}"]))
    assert len(explicit) == 1 and explicit[0].cached and explicit[0].report == first[f"cache/{names[3]}"].report
    log = hub.stats()["log"]
    assert len(log) == 1 and log[0][1].startswith(f"/api/models/cache/{names[3]}?") and "expand=sha" in log[0][1]

    # A new commit on one repo, and a damaged cache entry for another: exactly those two are read again.
    changed, damaged = f"cache/{names[0]}", f"cache/{names[1]}"
    hub._repos[changed].commits["main"] = "c" * 40
    hub._repos[changed].revisions["main"] = make_fixture(names[2])
    entry = next(p for p in (tmp_path / "ckcache" / "audit").glob("*.json")
                 if json.loads(p.read_text())["repo"] == damaged)
    data = json.loads(entry.read_text())
    data["doc"]["mtp"]["verdict"]["sglang"] = "unusable"  # an edit the checksum does not cover
    entry.write_text(json.dumps(data))
    listing = api.audit_select(author="cache")
    hub.reset_stats()
    third = audit()
    read = {urlsplit(e[1]).path.split("/resolve/")[0].lstrip("/") for e in hub.stats()["log"]
            if "/resolve/" in e[1]}
    assert read == {changed, damaged}
    assert not third[changed].cached and not third[damaged].cached
    assert third[damaged].report == first[damaged].report  # the damaged entry changed no answer
    assert third[changed].revision == "c" * 40
    own = own_reports(hub, [changed])[changed]["doc"]
    assert third[changed].report == _strip(own)


def test_requests_in_flight_stay_within_the_bound(make_fixture, monkeypatch):
    from ckptinspect import api

    with HubServer(latency_s=0.02) as srv:
        names = GOOD[:8]
        for name in names:
            srv.add_repo(f"org/{name}", make_fixture(name))
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        rows = list(api.audit([f"org/{n}" for n in names], jobs=3, max_requests=6, cache=False))
        assert len(rows) == len(names) and all(r.ok for r in rows)
        assert 2 <= srv.peak_in_flight <= 6  # repos ran at once, never more than 6 requests together


def test_usage_errors_exit_2(cli, tmp_path):
    done = cli("audit")
    assert done.returncode == 2 and "name repos" in done.stderr
    done = cli("audit", "org/x", "--gpu", "h200")
    assert done.returncode == 2 and "--gpu and --gpus go together" in done.stderr
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "bad.yaml").write_text("id: [unclosed\n")
    done = cli("audit", "org/x", "--rules-dir", str(tmp_path / "rules"))  # before any repo is read
    assert done.returncode == 2 and "bad.yaml" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_ctrl_c_leaves_valid_partial_jsonl(make_fixture):
    import signal

    with HubServer(latency_s=0.25) as srv:
        names = GOOD[:10]
        for name in names:
            srv.add_repo(f"org/{name}", make_fixture(name))
        proc = subprocess.Popen([sys.executable, "-m", "ckptinspect", "audit", *[f"org/{n}" for n in names],
                                 "--format", "jsonl", "--jobs", "2", "--no-cache"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=_env(srv), cwd=str(ROOT))
        first = proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    lines = [first] + rest.splitlines(keepends=True)
    rows = [json.loads(line) for line in lines]  # every line is a whole JSON object
    from ckptinspect.render.audit_out import validate_audit_json

    for row in rows:
        validate_audit_json(row)
    assert proc.returncode == 130, err
    assert "interrupted after" in err
    assert 1 <= len(rows) < len(names) and all(line.endswith("\n") for line in lines)


def failing_report(repo: str, options: dict) -> str:
    """An audit report function with a bug on one repo (an exception that is no CkptInspectError)."""
    if repo.endswith("llama_awq"):
        raise MemoryError("out of memory while reading llama_awq")
    from ckptinspect import api

    return api._audit_report(repo, options)


def test_a_repo_whose_report_crashes_is_that_repos_row_and_the_audit_goes_on(make_fixture):
    from ckptinspect.audit import AuditOptions, RepoRef, run_audit

    names = ("llama_bf16", "llama_awq", "llama_gptq", "mimo_7b")
    refs = [RepoRef(str(make_fixture(n))) for n in names]
    rows = {Path(r.repo).name: r for r in run_audit(refs, AuditOptions(jobs=2, cache=False), failing_report)}
    assert sorted(rows) == sorted(names)
    assert rows["llama_awq"].error.kind == "MemoryError" and "internal error" in rows["llama_awq"].error.message
    assert all(rows[n].ok for n in names if n != "llama_awq")


def test_fit_and_gate_of_a_row_are_the_reports(make_fixture):
    """Local directories (no Hub): with --gpu/--gpus each row's fit is its report's plan, and --fail-on
    trips on a row exactly when `report --fail-on` trips on that repo."""
    from ckptinspect import api

    # deepseek_v3_fp8 is the row that does not fit: its MoE width per rank is below the FP8 block at every
    # TP / EP (SGLang's validate_block_quant_shapes); the NVFP4 ones load since the plan follows the engines'
    # own NVFP4 checks
    names = ("qwen3_5_moe_nvfp4", "qwen3_5_moe_nvfp4_nomtp", "deepseek_v3_nvfp4", "deepseek_v3_fp8", "llama_awq",
             "mimo_7b")
    paths = [str(make_fixture(n)) for n in names]
    rows = {r.repo: r for r in api.audit(paths, gpu="h200", gpus=8, engine="sglang", jobs=2, cache=False)}
    assert sorted(rows) == sorted(paths)
    assert {r.fields["fit"]["fits"] for r in rows.values()} == {True, False}  # both cases are compared
    for path in paths:
        report = api.inspect(path, gpu="h200", gpus=8, engine="sglang")
        row = rows[path]
        assert row.fields["fit"]["fits"] == report.plan.ok
        if report.plan.ok:
            assert row.fields["fit"]["gpus_used"] == (report.plan.gpus_used or report.plan.gpus)
        for level in ("degraded", "unusable", "error"):
            assert bool(api.audit_gate(row, level, "sglang")) == bool(api.gate(report, level, "sglang")), \
                (path, level)
    assert any(api.audit_gate(r, "unusable", "sglang") for r in rows.values())  # the no-MTP quant trips it
    ordered = api.audit_sort(list(rows.values()), "sglang")
    tiers = [(0 if not r.fields["errors"] and r.fields["fit"]["fits"] else 1 if not r.fields["errors"] else 2)
             for r in ordered]
    assert tiers == sorted(tiers)


def test_progress_shows_on_a_terminal_only(make_fixture):
    import pty

    paths = [str(make_fixture(n)) for n in ("llama_bf16", "mimo_7b")]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "CKPTINSPECT_DEBUG")}
    main, tty = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "ckptinspect", "audit", *paths, "--format", "jsonl", "--no-cache"],
                            stdout=subprocess.PIPE, stderr=tty, env=env, cwd=str(ROOT))
    os.close(tty)
    out, _ = proc.communicate(timeout=300)
    shown = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        shown += chunk
    os.close(main)
    assert proc.returncode == 0
    assert len(out.decode().splitlines()) == 2
    assert b"audit: 1/2 repos" in shown and b"audit: 2/2 repos" in shown


def test_selection_ids_file_and_one_narrowed_listing(make_fixture, tmp_path, monkeypatch):
    from ckptinspect import api
    from ckptinspect.errors import CkptInspectError

    ids = tmp_path / "ids.txt"
    ids.write_text("# our quants\norg/from-file\n\n  alpha/Base-q1  # also listed\norg/explicit\n")
    with HubServer() as srv:
        for repo in ("alpha/Base-q1", "alpha/Base-q2", "alpha/Other", "beta/Base-q3"):
            srv.add_repo(repo, make_fixture("llama_bf16"), tags=(TAG,) if "Base" in repo else ())
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        refs = api.audit_select(ids=["org/explicit"], ids_file=ids, quantized_from=BASE, author="alpha",
                                search="base")
    # explicit ids first, then the file's, then the listing (BASE's quants by alpha whose id has "base")
    assert [r.repo_id for r in refs] == ["org/explicit", "org/from-file", "alpha/Base-q1", "alpha/Base-q2"]
    assert refs[0].sha is None and refs[2].sha == srv._repos["alpha/Base-q1"].commits["main"]
    ids.write_text("org/a org/b\n")
    with pytest.raises(CkptInspectError, match="line 1: one repo id per line"):
        api.audit_select(ids_file=ids)


def test_audit_schema_rejects_what_it_must():
    import jsonschema

    from ckptinspect.render.audit_out import validate_audit_json

    good = {"repo": "o/x", "revision": None, "status": "error", "cached": False,
            "error": {"kind": "NotFoundError", "message": "o/x: repository not found"}}
    validate_audit_json(good)
    for bad in ({**good, "status": "ok"}, {**good, "cached": True}, {k: v for k, v in good.items() if k != "error"},
                {"schema_version": 1, "repos": 1, "readable": 0, "rows": [{**good, "extra": 1}]}):
        with pytest.raises(jsonschema.ValidationError):
            validate_audit_json(bad)


def test_gate_and_columns_follow_the_engines_a_report_judged(make_fixture):
    """A report that judged other engines than SGLang and vLLM (a GGUF's llama.cpp verdict): `both` gates
    the engines it judged, a named engine it did not judge trips the gate (never a silent pass), and the
    table has a column per engine judged."""
    from ckptinspect import api
    from ckptinspect.audit.row import row_from_report
    from ckptinspect.render.audit_out import render_audit
    from ckptinspect.render.report import render_report

    doc = json.loads(render_report(api.inspect(str(make_fixture("llama_bf16"))), "json"))
    doc["mtp"]["verdict"] = {"llamacpp": "unusable"}
    row = row_from_report("o/gguf", doc)
    assert api.audit_gate(row, "unusable", "both") == ["llamacpp=unusable"]
    assert api.audit_gate(row, "unusable", "sglang") == ["no sglang verdict (judged: llamacpp)"]
    header = render_audit([row], "text").splitlines()[0].split()
    assert "llamacpp" in header and "sglang" not in header
