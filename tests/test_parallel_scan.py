"""The optional scan worker process (inventory/parallel.py, scan_process.py, scan_worker.py): with it
forced on, every report is byte-identical to the in-process scan's, local and through the test Hub
server; a worker that cannot start, dies or answers garbage changes nothing but time; errors still
name the first bad shard in index order; it is never started in a daemonic process, is used under the
``spawn`` start method, leaves no process, thread or descriptor behind, and dies with its parent."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ckptinspect.errors import CkptInspectError, HeaderError
from ckptinspect.inventory import cpu_idle, scan_child, scan_process
from ckptinspect.header.index import summarize_index
from ckptinspect.inventory.scan import ShardScan
from ckptinspect.inventory.cpu_idle import CpuSample, parse_proc_stat, read_sample, worker_pays
from ckptinspect.inventory.scan_process import PARALLEL_ENV, ScanWorker
from ckptinspect.pipeline import build_report
from ckptinspect.render.json_out import dumps, report_to_json
from fixtures.families_misc import llama_bf16
from fixtures.generate import FIXTURES, write_fixture

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf  # noqa: E402
from hub_server import HubServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fixture(llama_bf16("llama_many_shards", 16), tmp_path_factory.mktemp("parallel"))


@pytest.fixture
def worker_counts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Shards each report's worker answered (ScanWorker.results wrapped)."""
    counts: list[int] = []
    real = ScanWorker.results

    def results(self, *args):
        out = real(self, *args)
        counts.append(self.worker_scanned)
        return out

    monkeypatch.setattr(ScanWorker, "results", results)
    return counts


def _json(ref: str) -> str:
    """The report JSON less its timings, or the error's one line (fixtures of broken checkpoints)."""
    try:
        doc = report_to_json(build_report(ref, progress=False))
    except CkptInspectError as exc:
        return f"{type(exc).__name__}: {exc}"
    doc["source"].pop("stats", None)  # the Hub's request timings
    return dumps(doc)


def _worker_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker on for any volume and scanning every shard (the caller takes none from its backlog)."""
    monkeypatch.setenv(PARALLEL_ENV, "1")
    monkeypatch.setattr(scan_process, "SHARE_WITH_CALLER", False)


def test_every_fixture_reports_the_same_with_the_worker_scanning_every_shard(make_fixture, monkeypatch,
                                                                           worker_counts):
    names = sorted(FIXTURES)
    monkeypatch.setenv(PARALLEL_ENV, "0")
    here = {name: _json(str(make_fixture(name))) for name in names}
    _worker_only(monkeypatch)
    worker_counts.clear()
    there = {name: _json(str(make_fixture(name))) for name in names}
    assert [n for n in names if here[n] != there[n]] == []
    # the worker scanned the headers of every fixture that has any (a few broken ones fail before the scan)
    assert len(worker_counts) >= len(names) - 10 and sum(c >= 1 for c in worker_counts) >= len(names) - 12
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("share", [False, True])
def test_hub_reports_the_same_with_the_worker_fed_as_headers_arrive(make_fixture, many_shards, tmp_path,
                                                                   monkeypatch, worker_counts, share):
    isolate_hf(monkeypatch, tmp_path / "hf")
    repos = {"org/many": many_shards, "org/moe": make_fixture("qwen3_5_moe_nvfp4"),
             "org/dsv3": make_fixture("deepseek_v3_fp8")}
    with HubServer() as server:
        for repo, path in repos.items():
            server.add_repo(repo, path)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("CKPTINSPECT_HEADER_CACHE", "0")
        monkeypatch.setenv(PARALLEL_ENV, "0")
        server.reset_stats()
        here = {repo: _json(repo) for repo in repos}
        before = server.stats()
        monkeypatch.setenv(PARALLEL_ENV, "1")
        monkeypatch.setattr(scan_process, "SHARE_WITH_CALLER", share)
        isolate_hf(monkeypatch, tmp_path / "hf-again")  # cold again: the same requests are due
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        server.reset_stats()
        worker_counts.clear()
        there = {repo: _json(repo) for repo in repos}
        stats = server.stats()
    assert there == here
    assert len(worker_counts) == 3 and (share or min(worker_counts) >= 1)
    # the same wire with the worker on: the same requests and bytes (tests/test_hub*.py hold the limits)
    assert (stats["requests"], stats["bytes"]) == (before["requests"], before["bytes"])


def test_the_first_bad_shard_in_index_order_is_named_whoever_scanned_it(many_shards, tmp_path, monkeypatch,
                                                                        worker_counts):
    broken = tmp_path / "two_broken"
    shutil.copytree(many_shards, broken)
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    shards = list(dict.fromkeys(index["weight_map"].values()))
    for shard in (shards[3], shards[-1]):
        data = bytearray((broken / shard).read_bytes())
        at = data.index(b'"BF16"')
        data[at:at + 6] = b'"XX16"'
        (broken / shard).write_bytes(bytes(data))
    _worker_only(monkeypatch)
    with pytest.raises(HeaderError) as raised:
        build_report(str(broken), progress=False)
    assert shards[3] in str(raised.value) and "unknown dtype" in str(raised.value)
    assert worker_counts == [len(shards) - 2]  # the worker answered the good ones, refused both bad ones


@pytest.mark.parametrize("child", [
    None,  # cannot start: no such interpreter
    "import sys; sys.exit(3)",  # dies before reading anything
    "import sys; sys.stdin.buffer.read(); sys.stdout.buffer.write(b'not a pickle')",  # answers garbage
    "import sys; sys.stdin.buffer.read(); import pickle; pickle.dump([('x', None)], sys.stdout.buffer)",
])
def test_a_worker_that_fails_changes_nothing_but_time(many_shards, monkeypatch, worker_counts, child):
    monkeypatch.setenv(PARALLEL_ENV, "0")
    here = _json(str(many_shards))
    _worker_only(monkeypatch)
    if child is None:
        monkeypatch.setattr(scan_child.sys, "executable", str(Path(sys.executable).parent / "no-such-python"))
    else:
        monkeypatch.setattr(scan_child, "CHILD_COMMAND", child)
    threads = threading.active_count()
    assert _json(str(many_shards)) == here
    assert worker_counts in ([], [0])  # nothing came from the worker: everything was scanned here
    assert multiprocessing.active_children() == [] and threading.active_count() == threads


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts processes and descriptors through /proc")
def test_twenty_reports_with_the_worker_leave_nothing_behind(many_shards, monkeypatch, worker_counts):
    monkeypatch.setenv(PARALLEL_ENV, "1")
    build_report(str(many_shards), progress=False)
    threads, fds = threading.active_count(), len(os.listdir("/proc/self/fd"))
    children = set(os.listdir("/proc/self/task"))
    for _ in range(20):
        build_report(str(many_shards), progress=False)
    assert len(worker_counts) == 21  # a worker was started every time
    assert threading.active_count() == threads and len(os.listdir("/proc/self/fd")) <= fds
    assert set(os.listdir("/proc/self/task")) == children
    assert _child_pids(os.getpid()) == []


_BEFORE: set[int] = set()  # this process's children when the current test started


@pytest.fixture(autouse=True)
def _children_before_the_test():
    """Other tests' long-lived helpers (a session's servers under the same xdist worker) are not this
    test's: _child_pids counts only the children a test leaves behind."""
    _BEFORE.clear()
    _BEFORE.update(_all_children(os.getpid()))
    yield


def _child_pids(pid: int) -> list[int]:
    """Live (not zombie) children of ``pid`` that were not there when the test started."""
    return [child for child in _all_children(pid) if pid != os.getpid() or child not in _BEFORE]


def _all_children(pid: int) -> list[int]:
    """Live (not zombie) children of ``pid``, from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


_EMBED = """
import json, multiprocessing, os, sys
os.environ["CKPTINSPECT_PARALLEL_SCAN"] = "1"

def work(ref):
    from ckptinspect.inventory import scan_process
    from ckptinspect.pipeline import build_report
    from ckptinspect.render.json_out import dumps, report_to_json
    used = []
    real = scan_process.ScanWorker.results
    def results(self, *args):
        out = real(self, *args)
        used.append(self.worker_scanned)
        return out
    scan_process.ScanWorker.results = results
    scan_process.SHARE_WITH_CALLER = False
    doc = dumps(report_to_json(build_report(ref, progress=False)))
    return doc, multiprocessing.current_process().daemon, used, len(multiprocessing.active_children())

def in_process(ref, queue):
    queue.put(work(ref))

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:  # daemonic workers
        daemonic = pool.apply(work, (sys.argv[1],))
    queue = ctx.Queue()
    proc = ctx.Process(target=in_process, args=(sys.argv[1], queue))  # spawn-started, not daemonic
    proc.start()
    spawned = queue.get(timeout=120)
    proc.join()
    print(json.dumps([daemonic, spawned]))
"""


def test_never_in_a_daemonic_worker_and_used_under_spawn(many_shards, tmp_path, monkeypatch):
    monkeypatch.setenv(PARALLEL_ENV, "0")
    here = dumps(report_to_json(build_report(str(many_shards), progress=False)))
    script = tmp_path / "embed.py"
    script.write_text(_EMBED)
    proc = subprocess.run([sys.executable, str(script), str(many_shards)], capture_output=True, text=True,
                          timeout=240, cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    daemonic, spawned = json.loads(proc.stdout)
    assert daemonic == [here, True, [], 0]  # no worker started in the daemonic pool worker
    assert spawned[:2] == [here, False] and spawned[2][0] >= 1 and spawned[3] == 0


_PARENT = """
import sys, time
from ckptinspect.inventory.scan_process import ScanWorker
worker = ScanWorker()
worker.feed("a.safetensors", b"x" * 100, None)
while worker.proc is None or not worker.sent:
    time.sleep(0.01)
print(worker.proc.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(sys.platform == "win32" or not Path("/proc").is_dir(), reason="POSIX signals, /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_worker_dies_with_its_parent(tmp_path, sig):
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True, cwd=str(ROOT),
                              env={**os.environ, "PYTHONPATH": str(ROOT), PARALLEL_ENV: "1"})
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.send_signal(sig)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _sample(*cpus: tuple[int, int]) -> CpuSample:
    """A CpuSample of (idle + iowait ticks, all ticks) for CPUs 0, 1, ..."""
    return CpuSample(dict(enumerate(cpus)))


def test_proc_stat_is_read_as_idle_plus_iowait_over_the_first_eight_fields():
    text = ("cpu  10 0 10 100 5 0 0 0 0 0\n"
            "cpu0 1 2 3 40 5 6 7 8 100 100\n"  # guest fields (100 100) are inside user / nice already
            "cpu1 10 0 0 50 0 0 0 0\n"
            "intr 1 2 3\nctxt 99\ncpufreq junk\n")
    assert parse_proc_stat(text).ticks == {0: (45, 72), 1: (50, 60)}


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="Linux /proc/stat")
def test_this_machines_proc_stat_covers_the_cpus_this_process_may_use():
    sample = read_sample()
    assert sample is not None and all(idle <= total for idle, total in sample.ticks.values())
    cpus = cpu_idle.usable_cpus()
    assert cpus is not None and cpus <= set(sample.ticks)
    assert cpu_idle.process_ticks(os.getpid()) > 0 and cpu_idle.process_ticks(2 ** 30) == 0


def test_the_worker_pays_only_when_most_of_a_cpu_stayed_idle_over_the_window():
    first = _sample((0, 0), (0, 0))
    # 100 ticks per CPU: one CPU idle throughout -> 1.0 idle
    assert cpu_idle.idle_cpus(first, _sample((0, 100), (100, 100)), None) == (1.0, 100.0)
    assert worker_pays(first, _sample((0, 100), (100, 100)), None) is True
    assert worker_pays(first, _sample((30, 100), (30, 100)), None) is False  # 0.6 idle
    assert worker_pays(first, _sample((35, 100), (35, 100)), None) is True  # 0.7 idle
    # the worker's own start-up ran on the idle CPU: counted as idle
    assert worker_pays(first, _sample((30, 100), (30, 100)), None, own_ticks=20) is True
    # too short to tell (under 10 ticks per CPU)
    assert worker_pays(first, _sample((0, 8), (8, 8)), None) is None
    # only the CPUs this process may use count: the idle one is not among them
    assert worker_pays(first, _sample((0, 100), (100, 100), (0, 100)), {0, 2}) is False
    assert worker_pays(first, _sample((0, 100), (100, 100), (0, 100)), {0, 1}) is True
    # one CPU to run on: never, however idle
    assert worker_pays(first, _sample((100, 100), (100, 100)), {1}) is False
    # a CPU gone between the samples is left out; no common CPU: no window
    assert worker_pays(first, CpuSample({0: (0, 100)}), None) is False
    assert cpu_idle.idle_cpus(first, CpuSample({}), None) == (0.0, 0.0)


def test_without_proc_stat_the_cpu_count_and_load_average_decide():
    assert cpu_idle.spare_core_without_proc_stat(2, 0.2)
    assert not cpu_idle.spare_core_without_proc_stat(2, 0.5)  # 2 - 0.5 - this process < 0.7
    assert cpu_idle.spare_core_without_proc_stat(8, 5.0)
    assert not cpu_idle.spare_core_without_proc_stat(1, 0.0)
    assert not cpu_idle.spare_core_without_proc_stat(None, 0.0)
    assert not cpu_idle.spare_core_without_proc_stat(8, None)  # no load average (Windows): in-process


class _Summary:
    def __init__(self, tensors: int) -> None:
        self.counts = {"a.safetensors": tensors}


def _measured(monkeypatch: pytest.MonkeyPatch, decision: bool | None, spawn: bool | None = True) -> None:
    """The CPU measurement's answers, whatever this machine is doing: ``spawn`` when the worker would be
    spawned (no worker CPU time yet: three arguments), ``decision`` when it would be fed (four)."""
    monkeypatch.delenv(PARALLEL_ENV, raising=False)
    monkeypatch.setattr(cpu_idle, "read_sample", lambda: _sample((0, 0), (0, 0)))
    monkeypatch.setattr(cpu_idle, "usable_cpus", lambda: {0, 1})
    monkeypatch.setattr(cpu_idle, "worker_pays", lambda *a: spawn if len(a) == 3 else decision)


def test_the_worker_is_spawned_during_the_read_and_fed_only_when_a_cpu_is_free(monkeypatch):
    _measured(monkeypatch, True)
    monkeypatch.setattr(scan_process, "SHARE_WITH_CALLER", False)
    header = b'{"w.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    for index_names, same in ((["w.weight"], True), (["v.weight"], False)):
        index = {"weight_map": {name: "a.safetensors" for name in index_names}}
        summary = summarize_index(index, source="index")
        worker = ScanWorker()
        worker.read_starts()
        assert not worker.started and worker.timer is not None  # spawned by the timer, once measured
        worker.index_arrives(json.dumps(index).encode())  # the Hub's bytes: the child parses them itself
        assert worker.started and worker.decision is True and worker.writer is not None
        worker.expect(_Summary(scan_process.MIN_WORKER_TENSORS))
        worker.feed("a.safetensors", header, 8 + len(header) + 8)
        scans = worker.results(lambda *a: None, summary)
        assert worker.worker_scanned == 1 and scans["a.safetensors"].tensors == 1
        # the child compared the names with the index in its own process; this one's fingerprint stands in
        assert (scans["a.safetensors"].name_hash == summary.name_hashes["a.safetensors"]) is same
        assert not worker.started and worker.timer is None and _child_pids(os.getpid()) == []


@pytest.mark.parametrize("free", [True, False])
def test_the_timer_spawns_the_worker_before_the_index_arrives_or_gives_up(monkeypatch, free):
    _measured(monkeypatch, True, spawn=free)
    failures = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    threads = threading.active_count()
    worker = ScanWorker()
    worker.read_starts()
    timer = worker.timer
    timer.join(30)
    assert worker.started is free and worker.decision is (None if free else False)
    worker.close()
    assert failures == [] and _child_pids(os.getpid()) == [] and threading.active_count() == threads


def test_a_worker_that_finds_the_cpus_busy_while_fed_gets_no_more_and_answers_what_it_has(monkeypatch):
    monkeypatch.delenv(PARALLEL_ENV, raising=False)
    monkeypatch.setattr(scan_process, "SHARE_WITH_CALLER", False)
    monkeypatch.setattr(cpu_idle, "read_sample", lambda: _sample((0, 0), (0, 0)))
    monkeypatch.setattr(cpu_idle, "usable_cpus", lambda: {0, 1})
    looks = iter([True, True, None, None, False])  # spawn; feed; a, b: too short to tell; c: busy
    monkeypatch.setattr(cpu_idle, "worker_pays", lambda *a: next(looks, False))
    shards = [f"{n}.safetensors" for n in "abcd"]
    index = {"weight_map": {f"{n}.weight": shard for n, shard in zip("abcd", shards)}}
    worker = ScanWorker()
    worker.read_starts()
    worker.index_arrives(json.dumps(index).encode())
    assert worker.decision is True
    for n, shard in zip("abcd", shards):
        header = b'{"%s.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' % n.encode()
        worker.feed(shard, header, None)
        deadline = time.monotonic() + 30
        while not worker.draining and shard not in worker.sent and time.monotonic() < deadline:
            time.sleep(0.005)  # the writer thread took it
    assert worker.draining and worker.sent == shards[:2]
    scans = worker.results(lambda *a: None, summarize_index(index, source="index"))
    assert sorted(scans) == shards[:2]  # fed before the busy look; c and d are scanned by the caller
    assert worker.worker_scanned == 2 and _child_pids(os.getpid()) == []


def test_one_measured_worker_per_process_at_a_time(monkeypatch):
    """Reports in threads (an audit) would each measure the same free CPU: only the first gets a worker."""
    _measured(monkeypatch, True)
    first, second = ScanWorker(), ScanWorker()
    for worker in (first, second):
        worker.read_starts()
        worker.index_arrives(b'{"weight_map": {}}')
    try:
        assert first.started and not second.started and not second.allowed and not second.settle()
    finally:
        first.close()
    third = ScanWorker()
    third.read_starts()
    third.index_arrives(b'{"weight_map": {}}')
    assert third.started  # the slot came back with the first one's close
    third.close()
    assert scan_child._live == 0 and _child_pids(os.getpid()) == []


def test_a_hook_that_fails_stops_the_worker_and_never_the_read(monkeypatch):
    _measured(monkeypatch, True)

    def no_thread(self, items):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(ScanWorker, "_push", no_thread)
    worker = ScanWorker()
    worker.read_starts()
    assert worker.index_arrives(b'{"weight_map": {}}') is None  # spawned, then the writer could not start
    worker.feed("a.safetensors", b"{}", None)
    assert not worker.started and worker.broken and not worker.settle() and _child_pids(os.getpid()) == []


def test_answers_from_a_child_that_read_another_index_are_not_used():
    summary = summarize_index({"weight_map": {"w": "a.safetensors", "v": "a.safetensors"}}, source="index")
    scan = ShardScan("a.safetensors", 10, None, 2, 8, {}, 12345)  # the child's name_hash: its own seed
    reply = (({"a.safetensors": 2}, {"a.safetensors": 2}), [("a.safetensors", scan, True)])
    assert scan_child.trusted_answers(reply, {"a.safetensors"}, summary)["a.safetensors"].name_hash == \
        summary.name_hashes["a.safetensors"]
    for check in (None, ({"a.safetensors": 1}, {"a.safetensors": 2}), ({"a.safetensors": 2}, {"a.safetensors": 3})):
        assert scan_child.trusted_answers((check, reply[1]), {"a.safetensors"}, summary) == {}
    assert scan_child.trusted_answers(reply, set(), summary) == {}  # never sent: not the child's to answer


@pytest.mark.parametrize("how", ["busy from the start", "busy by the index", "small", "never told"])
def test_the_worker_is_stopped_as_soon_as_it_cannot_pay(monkeypatch, how):
    _measured(monkeypatch, {"busy by the index": False, "never told": None}.get(how, True),
              spawn=how != "busy from the start")
    worker = ScanWorker()
    worker.read_starts()
    worker.index_arrives(b'{"weight_map": {}}')
    assert worker.started is (how != "busy from the start" and how != "busy by the index")
    worker.expect(_Summary(10 if how == "small" else scan_process.MIN_WORKER_TENSORS))
    worker.feed("a.safetensors", b"x" * 600, None)
    if how == "never told":  # the read ended before a window long enough to tell
        assert worker.started and worker.held
        assert not worker.settle()
    assert not worker.started and worker.decision is False and worker.held == []
    assert worker.results(lambda *a: None, None) == {} and _child_pids(os.getpid()) == []


def test_no_worker_with_one_cpu_or_switched_off(monkeypatch):
    _measured(monkeypatch, True)
    monkeypatch.setattr(cpu_idle, "usable_cpus", lambda: {0})
    one = ScanWorker()
    one.read_starts()
    assert not one.started
    monkeypatch.setenv(PARALLEL_ENV, "0")
    assert not scan_process.worker_allowed()
    off = ScanWorker()
    off.read_starts()
    off.feed("a.safetensors", b"x", None)
    assert not off.started
    monkeypatch.setenv(PARALLEL_ENV, "1")
    assert scan_process.worker_allowed()  # forced on, whatever the CPUs


def test_an_index_naming_other_tensors_is_found_alike_with_the_worker(many_shards, tmp_path, monkeypatch,
                                                                      worker_counts):
    """The cross-check by fingerprint: a same-count, same-length rename in the index (only the names'
    fingerprint tells) is reported the same whichever process scanned the shard."""
    renamed = tmp_path / "renamed"
    shutil.copytree(many_shards, renamed)
    path = renamed / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    name = next(n for n in index["weight_map"] if "q_proj" in n)
    index["weight_map"][name.replace("q_proj", "k_qrox")] = index["weight_map"].pop(name)
    path.write_text(json.dumps(index))
    monkeypatch.setenv(PARALLEL_ENV, "0")
    here = _json(str(renamed))
    _worker_only(monkeypatch)
    there = _json(str(renamed))
    assert there == here and "index-header-mismatch" in here and worker_counts and worker_counts[0] >= 1


def test_the_pipes_resolve_no_class_but_the_scan_records():
    """Both ends unpickle with an allow-list: the parent only ShardScan / GroupTally, the child nothing."""
    import io
    import os
    import pickle

    from ckptinspect.inventory.scan import scan_header_unpaused
    from ckptinspect.inventory.scan_child import read_answers
    from ckptinspect.inventory.scan_worker import _Plain

    header = b'{"a.0.w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}'
    scan = scan_header_unpaused("s.safetensors", header, None)
    reply = (({"s.safetensors": 1}, {"s.safetensors": 5}), [("s.safetensors", scan, True)])
    assert read_answers(io.BytesIO(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))) == reply
    for hostile in (os.getcwd, (None, [("s", os.system, True)])):
        with pytest.raises(pickle.UnpicklingError, match="is not a scan record"):
            read_answers(io.BytesIO(pickle.dumps(hostile)))
    item = ("s.safetensors", header, 123)
    assert _Plain(io.BytesIO(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))).load() == item
    with pytest.raises(pickle.UnpicklingError, match="is not plain data"):
        _Plain(io.BytesIO(pickle.dumps(scan))).load()
