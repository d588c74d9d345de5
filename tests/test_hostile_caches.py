"""Caches that cannot be forged (issue 36, cause 2): every cache ckptinspect keeps on disk is forged the
way someone who can write the cache directory (a shared CI cache store, a pull request's job) would:
entries edited with every checksum the file holds recomputed. A forged entry must be a miss (the answer
read again from the source), never an answer or a gate.

The caches: the Hub header cache (sources/header_cache.py), the audit report cache (audit/cache.py),
and the removed rule-validation cache (a file of that name must be ignored). All run as the CLI in a
subprocess against the test Hub server."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_server import HubServer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GOOD = "org/with-mtp"  # qwen3_5_moe_nvfp4: mtp.* tensors present, both verdicts ready
RENAMED = "org/renamed-mtp"  # the same checkpoint with every mtp.* tensor renamed xtp.* (no MTP layer)


def _rename_tensors(src: Path, dst: Path, old: bytes, new: bytes) -> None:
    """Copy a checkpoint, renaming tensor prefixes in every shard header and the index (same length)."""
    shutil.copytree(src, dst)
    for shard in dst.glob("*.safetensors"):
        blob = shard.read_bytes()
        (n,) = struct.unpack("<Q", blob[:8])
        header = blob[8:8 + n].replace(b'"' + old, b'"' + new)
        shard.write_bytes(blob[:8] + header + blob[8 + n:])
    index = dst / "model.safetensors.index.json"
    index.write_bytes(index.read_bytes().replace(b'"' + old, b'"' + new))


@pytest.fixture()
def env(tmp_path) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    full.pop("CKPTINSPECT_DEBUG", None)
    full.update({"HF_HOME": str(tmp_path / "hf"), "CKPTINSPECT_CACHE_DIR": str(tmp_path / "cache"),
                 "CKPTINSPECT_CACHE_KEY_FILE": str(tmp_path / "config" / "cache-key"),
                 "CKPTINSPECT_HEADER_CACHE": "1"})
    return full


@pytest.fixture()
def hub(make_fixture, tmp_path):
    good = make_fixture("qwen3_5_moe_nvfp4")
    renamed = tmp_path / "renamed"
    _rename_tensors(good, renamed, b"mtp.", b"xtp.")
    with HubServer() as srv:
        srv.add_repo(GOOD, good)
        srv.add_repo(RENAMED, renamed)
        yield srv


def _cli(env: dict, hub: HubServer, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**env, "HF_ENDPOINT": hub.url}, timeout=300)


def _answer(env: dict, hub: HubServer, repo: str) -> tuple:
    done = _cli(env, hub, "report", repo, "--format", "json")
    assert done.returncode == 0, done.stderr[-2000:]
    mtp = json.loads(done.stdout)["mtp"]
    return mtp["present_layers"], {k: v["verdict"] if isinstance(v, dict) else v for k, v in mtp["verdict"].items()}


def _forge_header_entries(cache: Path, old: bytes, new: bytes) -> int:
    """Edit every header-cache entry as a forger would: rename tensors in the payload and recompute the
    32-byte digest as sha256(key + payload) (all a checksum-only format has). Returns entries changed."""
    changed = 0
    for entry in (cache / "hub-headers").glob("*.hdr"):
        blob = entry.read_bytes()
        (key_len,) = struct.unpack(">I", blob[8:12])
        key = blob[12:12 + key_len]
        payload = blob[12 + key_len + 32:]
        forged = payload.replace(b'"' + old, b'"' + new)
        if forged != payload:
            entry.write_bytes(blob[:12 + key_len] + hashlib.sha256(key + forged).digest() + forged)
            changed += 1
    return changed


@pytest.mark.parametrize("repo,old,new", [(GOOD, b"mtp.", b"xtp."), (RENAMED, b"xtp.", b"mtp.")],
                         ids=["mtp-renamed-away", "mtp-renamed-in"])
def test_a_forged_header_cache_entry_changes_no_answer(hub, env, tmp_path, repo, old, new):
    first = _answer(env, hub, repo)
    assert first == ((1, {"sglang": "ready", "vllm": "ready"}) if repo == GOOD else first)
    assert _forge_header_entries(tmp_path / "cache", old, new) >= 1
    assert _answer(env, hub, repo) == first  # the forged entries are misses: read again from the Hub
    clean = dict(env, CKPTINSPECT_HEADER_CACHE="0")
    assert _answer(clean, hub, repo) == first


def test_the_two_checkpoints_really_differ(hub, env):
    """The forge would change the answer if believed: the renamed checkpoint has no MTP layer."""
    present, verdicts = _answer(env, hub, RENAMED)
    assert present == 0 and set(verdicts.values()) == {"unusable"}


def test_an_edited_audit_report_cannot_flip_the_gate(hub, env, tmp_path):
    args = ("audit", RENAMED, "--fail-on", "unusable", "--format", "json")
    first = _cli(env, hub, *args)
    assert first.returncode == 1, first.stderr[-2000:]  # no MTP layer: the gate trips
    entries = list((tmp_path / "cache" / "audit").glob("*.json"))
    assert len(entries) == 1
    entry = json.loads(entries[0].read_text())
    doc = entry["doc"]
    for engine in doc["mtp"]["verdict"]:
        if isinstance(doc["mtp"]["verdict"][engine], dict):
            doc["mtp"]["verdict"][engine]["verdict"] = "ready"
        else:
            doc["mtp"]["verdict"][engine] = "ready"
    doc["mtp"]["present_layers"] = 1
    doc["findings"] = []
    # every checksum such a file could hold, recomputed over the edited document
    entry["checksum"] = hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    entries[0].write_text(json.dumps(entry))
    second = _cli(env, hub, *args)
    assert second.returncode == 1, second.stderr[-2000:]
    row = json.loads(second.stdout)
    rows = row["rows"] if isinstance(row, dict) and "rows" in row else row
    assert not any(r.get("cached") for r in rows)  # read again, not taken from the edited entry


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_hostile_audit_cache_entries_are_misses_not_hangs(hub, env, tmp_path):
    """A FIFO, a 4 GiB sparse file or a deeply nested document in place of an audit cache entry: a miss
    (the repo read again), in bounded time, no traceback."""
    args = ("audit", GOOD, "--format", "json")
    assert _cli(env, hub, *args).returncode == 0
    entry = next((tmp_path / "cache" / "audit").glob("*.json"))
    for kind in ("fifo", "sparse", "deep"):
        entry.unlink()
        if kind == "fifo":
            os.mkfifo(entry)
        elif kind == "sparse":
            with open(entry, "wb") as fh:
                fh.truncate(4 * 1024 ** 3)
        else:
            entry.write_text("[" * 100_000 + "]" * 100_000)
        done = _cli(env, hub, *args)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (kind, done.stderr[-2000:])
        rows = json.loads(done.stdout)
        rows = rows["rows"] if isinstance(rows, dict) and "rows" in rows else rows
        assert not rows[0]["cached"], kind


def test_a_rule_validation_cache_file_is_never_read(hub, env, tmp_path, make_fixture):
    """The third cache earlier versions kept (issue 26) stays gone: a planted file changes nothing."""
    first = _answer(env, hub, GOOD)
    (tmp_path / "cache").mkdir(exist_ok=True)
    (tmp_path / "cache" / "rules-validated.json").write_text(json.dumps({"forged": True, "families": []}))
    assert _answer(env, hub, GOOD) == first


# -- the key itself --------------------------------------------------------------------------------------
def _key_in(tmp_path: Path, code: str, **extra: str) -> str:
    env = {**os.environ, "CKPTINSPECT_CACHE_DIR": str(tmp_path / "cache"), **extra}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=60).stdout.strip()


# the environment read once into Settings, as the CLI does; cache_auth takes the key file and the cache from it
KEY_CODE = ("from ckptinspect.cache_auth import cache_key; from ckptinspect.settings import Settings; "
            "s = Settings.from_environ(); k = cache_key(s.cache_dir, s.cache_key_file); "
            "print('none' if k is None else len(k))")


def test_the_key_is_made_private_outside_the_cache_and_reused(tmp_path):
    key_file = tmp_path / "config" / "ckptinspect" / "cache-key"
    assert _key_in(tmp_path, KEY_CODE, CKPTINSPECT_CACHE_KEY_FILE=str(key_file)) == "32"
    assert key_file.stat().st_mode & 0o777 == 0o600
    first = key_file.read_bytes()
    assert _key_in(tmp_path, KEY_CODE, CKPTINSPECT_CACHE_KEY_FILE=str(key_file)) == "32"
    assert key_file.read_bytes() == first


def test_a_key_inside_the_cache_or_readable_by_others_is_no_key(tmp_path):
    inside = tmp_path / "cache" / "cache-key"
    assert _key_in(tmp_path, KEY_CODE, CKPTINSPECT_CACHE_KEY_FILE=str(inside)) == "none"
    assert not inside.exists()
    shared = tmp_path / "shared-key"
    shared.write_text("ab" * 32 + "\n")
    shared.chmod(0o644)
    assert _key_in(tmp_path, KEY_CODE, CKPTINSPECT_CACHE_KEY_FILE=str(shared)) == "none"
    shared.chmod(0o600)
    assert _key_in(tmp_path, KEY_CODE, CKPTINSPECT_CACHE_KEY_FILE=str(shared)) == "32"


def test_without_a_key_nothing_is_cached_and_the_answer_stands(hub, env, tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")  # the key's folder cannot be made
    no_key = dict(env, CKPTINSPECT_CACHE_KEY_FILE=str(blocked / "cache-key"))
    first = _answer(no_key, hub, GOOD)
    assert first[0] == 1
    assert not list((tmp_path / "cache").glob("hub-headers/*.hdr"))
