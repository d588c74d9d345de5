"""Hub speed on two server implementations: the project's test server (tests/hub_server.py: HTTP/1.1
keep-alive, backlog 256) and a plain ``http.server`` one (tests/plain_hub_server.py: HTTP/1.0, one
connection per request, backlog 5), both with the same delay per request, serving the full-scale sparse
replica of nvidia/Qwen3.5-397B-A17B-NVFP4. In one run, alternating tools per round, cold HF cache:

- report: ``ckptinspect report org/name --format json --quiet --verbose`` (subprocess; phases from
  --verbose: info_s, the repo info; json_s, the small JSON files and the index, with the header reads
  that start before it; headers_s, the header reads still going when the index is in; scan_rest_s, the
  scan after the last header, with what the scan helper did not finish while they arrived);
- theirs: ``HfApi.get_safetensors_metadata`` (subprocess too, so both pay interpreter start-up).

    python benchmarks/bench_hub_servers.py [--replica DIR] [--latency-ms 20] [--runs 3] [--workers N] [--timeline]
                                           [--base DIR] [--wait-idle CPUS]

``--base DIR`` also runs the ``report`` of another checkout (``git worktree add DIR COMMIT``) in every
round, so a change is measured against the code before it in the same minutes; ``--wait-idle 1.7``
starts each round only once the machine shows that many idle CPUs (``/proc/stat`` over one second,
waiting at most a minute), and says how many rounds started so. The order of the tools alternates
from round to round.

``--timeline`` adds one traced ``report`` run per server: a timestamp (from the benchmark's start of
the subprocess) at the start and end of each stage of the command, in every process it forks (the
index child, the scan helper), so the time between the phases that --verbose reports can be placed
(interpreter start, imports, waiting, scanning, rendering).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPO = "nvidia/Qwen3.5-397B-A17B-NVFP4"
THEIRS = ("import sys; from huggingface_hub import HfApi; "
          "m = HfApi(endpoint=sys.argv[1]).get_safetensors_metadata(sys.argv[2]); "
          "print(sum(len(f.tensors) for f in m.files_metadata.values()))")


class _Served:
    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def add_replica_server_options(ap: argparse.ArgumentParser) -> None:
    """The options of the paired benchmarks that serve one replica through one of the two test servers."""
    ap.add_argument("--replica", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--server", choices=("keepalive", "plain"), default="keepalive")
    ap.add_argument("--latency-ms", type=float, default=20.0)


def serve_replica(args: argparse.Namespace) -> _Served:
    """The replica under REPO through the server ``args.server`` names, ``args.latency_ms`` per request."""
    script = {"keepalive": "hub_server_process.py", "plain": "plain_hub_server.py"}[args.server]
    return _Served([sys.executable, str(ROOT / "tests" / script), "--latency-ms", str(args.latency_ms), REPO,
                    str(args.replica)])


def _env(url: str, home: str, workers: int | None, root: Path = ROOT) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HUB_OFFLINE")}
    # A cold header cache too (sources/header_cache.py): a shared one answers every round after the first.
    env.update(HF_ENDPOINT=url, HF_HOME=home, PYTHONPATH=str(root), CKPTINSPECT_CACHE_DIR=str(Path(home) / "ckptinspect"))
    if workers:
        env["CKPTINSPECT_MAX_WORKERS"] = str(workers)
    return env


def _report(url: str, workers: int | None, root: Path = ROOT) -> tuple[float, dict[str, str]]:
    home = tempfile.mkdtemp(prefix="bench_hf_")
    try:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "ckptinspect", "report", REPO, "--format", "json", "--quiet",
                               "--verbose"], capture_output=True, text=True, env=_env(url, home, workers, root),
                              timeout=600, cwd=str(root))
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if proc.returncode not in (0, 1):
        raise RuntimeError(proc.stderr.strip()[-300:])
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("stats: "))
    stats = dict(part.split("=", 1) for part in line[len("stats: "):].split(", "))
    return wall, stats


def _theirs(url: str) -> float:
    home = tempfile.mkdtemp(prefix="bench_hf_")
    try:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", THEIRS, url, REPO], capture_output=True, text=True,
                              env=_env(url, home, None), timeout=600)
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip()[-300:])
    return wall


def _idle_cpus(seconds: float = 1.0) -> float:
    """CPUs idle over the next ``seconds`` (from /proc/stat; the CPU count where it cannot be read)."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # idle + iowait
    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except OSError:
        return float(os.cpu_count() or 1)
    return (os.cpu_count() or 1) * (idle1 - idle0) / max(1, total1 - total0)


def _wait_idle(cpus: float, limit_s: float = 60.0) -> bool:
    ends = time.monotonic() + limit_s
    while time.monotonic() < ends:
        if _idle_cpus() >= cpus:
            return True
    return False


# (module, attribute, class or None, label): the stages the timeline marks (wrapped in the traced run).
TRACED = (
    ("ckptinspect.api", "inspect", None, "api.inspect"),
    ("ckptinspect.sources.hub", "open_hub", None, "open_hub"),
    ("ckptinspect.sources.hub", "model_info", None, "repo info"),
    ("ckptinspect.sources.hub", "summarize_index", None, "index summary"),
    ("ckptinspect.sources.interface", "parse_json_bytes", None, "index JSON parse"),
    ("ckptinspect.sources.local", "summarize_index", None, "index summary"),
    ("ckptinspect.sources.hf_cache", "cache_store", None, "HF cache write"),
    ("ckptinspect.pipeline", "build_inventory", None, "inventory"),
    ("ckptinspect.pipeline", "report_from_raw", None, "report pipeline"),
    ("ckptinspect.render.report", "render_report", None, "render"),
)


def _trace_child(argv: list[str]) -> None:
    """Run ``ckptinspect report`` with TRACED wrapped; marks go to stderr as ``@ seconds [process] event``."""
    import importlib
    import atexit

    t0 = float(os.environ["BENCH_TRACE_T0"])
    main_pid = os.getpid()
    scans: dict[int, list[float]] = {}

    def mark(event: str) -> None:
        who = "" if os.getpid() == main_pid else "    [child] "
        sys.stderr.write(f"@ {time.time() - t0:6.3f} {who}{event}\n")

    mark("interpreter up")
    import ckptinspect.cli.report_cmd  # noqa: F401 - what the command imports before it runs
    import ckptinspect.inventory.scan as scanning  # where the pipeline's scan calls the per-header scan
    mark("imports done")
    for module, attr, cls, label in TRACED:
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        original = getattr(owner, attr)

        def wrapped(*args, _original=original, _label=label, **kwargs):
            mark(f"> {_label}")
            try:
                return _original(*args, **kwargs)
            finally:
                cpu = os.times()
                mark(f"< {_label} (process CPU so far {cpu.user + cpu.system:.3f} s)")
        setattr(owner, attr, wrapped)
    scan = scanning.scan_header_unpaused

    def counted(*args):
        out = scan(*args)
        done = scans.setdefault(os.getpid(), [])
        done.append(time.time() - t0)
        if os.getpid() != main_pid and len(done) % 10 in (0, 1):  # a forked child ends without atexit
            mark(f"helper: {len(done)} headers scanned")
        return out
    scanning.scan_header_unpaused = counted

    def summary() -> None:
        at = scans.get(main_pid)
        if at:
            mark(f"parent scanned {len(at)} headers, the first done at {at[0]:.3f}, the last at {at[-1]:.3f}")
    atexit.register(summary)
    sys.argv = ["ckptinspect", *argv]
    from ckptinspect.cli import main as cli_main
    try:
        cli_main()
    finally:
        cpu = os.times()
        mark(f"command done (CPU: this process {cpu.user + cpu.system:.3f} s, its waited-for children "
             f"{cpu.children_user + cpu.children_system:.3f} s)")


def _timeline(url: str, workers: int | None) -> str:
    home = tempfile.mkdtemp(prefix="bench_hf_")
    env = _env(url, home, workers)
    t0 = time.time()
    env["BENCH_TRACE_T0"] = repr(t0)
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--trace-child", "report", REPO,
                               "--format", "json", "--quiet", "--verbose"], capture_output=True, text=True,
                              env=env, timeout=600)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return proc.stderr + f"@ {time.time() - t0:6.3f} process gone (exit code {proc.returncode})\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replica", type=Path)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None, help="CKPTINSPECT_MAX_WORKERS for report")
    ap.add_argument("--timeline", action="store_true", help="one traced report run per server (see above)")
    ap.add_argument("--base", type=Path, default=None, help="another checkout whose report runs in every round too")
    ap.add_argument("--wait-idle", type=float, default=None, metavar="CPUS",
                    help="start each round once this many CPUs are idle (at most a minute's wait)")
    args = ap.parse_args()
    replica = args.replica
    if replica is None:
        sys.path.insert(0, str(ROOT))
        from fixtures.replica import build_replica

        replica = build_replica(Path(tempfile.mkdtemp(prefix="bench_hub_replica_")))
    servers = {
        "test server (HTTP/1.1 keep-alive)": [sys.executable, str(ROOT / "tests" / "hub_server_process.py"),
                                              "--latency-ms", str(args.latency_ms), REPO, str(replica)],
        "plain http.server (HTTP/1.0)": [sys.executable, str(ROOT / "tests" / "plain_hub_server.py"),
                                         "--latency-ms", str(args.latency_ms), REPO, str(replica)],
    }
    print(f"latency {args.latency_ms:g} ms per request, {args.runs} runs after 1 warm-up, median; "
          f"load average {os.getloadavg()[0]:.1f} at start")
    for name, cmd in servers.items():
        served = _Served(cmd)
        try:
            _report(served.url, args.workers), _theirs(served.url)  # warm-up: page cache, imports
            ours, phases, theirs, base, idle = [], [], [], [], 0
            tools = [("ours", lambda: _report(served.url, args.workers)), ("theirs", lambda: (_theirs(served.url), {}))]
            if args.base is not None:
                tools.append(("base", lambda: _report(served.url, args.workers, args.base.resolve())))
            for round_no in range(args.runs):
                if args.wait_idle is not None:
                    idle += _wait_idle(args.wait_idle)
                for tool, run in (tools if round_no % 2 == 0 else tools[::-1]):
                    wall, stats = run()
                    {"ours": ours, "theirs": theirs, "base": base}[tool].append(wall)
                    if tool == "ours":
                        phases.append(stats)
            trace = _timeline(served.url, args.workers) if args.timeline else ""
        finally:
            served.close()
        med = {k: statistics.median(float(p.get(k, 0)) for p in phases)
               for k in ("info_s", "json_s", "headers_s", "scan_rest_s")}
        o, t = statistics.median(ours), statistics.median(theirs)
        print(f"{name}: report {o:.3f} s (runs {', '.join(f'{w:.2f}' for w in ours)}), get_safetensors_metadata "
              f"{t:.3f} s (runs {', '.join(f'{w:.2f}' for w in theirs)}): {o / t:.2f}x; report phases: repo info "
              f"{med['info_s']:.3f} s, JSON files {med['json_s']:.3f} s, headers after the index "
              f"{med['headers_s']:.3f} s, scan after the fetch {med['scan_rest_s']:.3f} s; "
              f"{phases[-1].get('headers_before_index', 0)} headers asked for before the index; "
              f"requests {phases[-1]['requests']}, bytes {int(phases[-1]['bytes_fetched']):,}")
        if base:
            b = statistics.median(base)
            print(f"  base ({args.base}): report {b:.3f} s (runs {', '.join(f'{w:.2f}' for w in base)}): "
                  f"{b / t:.2f}x; this checkout / base {o / b:.2f}")
        if args.wait_idle is not None:
            print(f"  {idle} of {args.runs} rounds started with >= {args.wait_idle:g} idle CPUs")
        if trace:
            print(f"timeline of one more report run ({name}):\n{trace}", end="")
    print(f"load average {os.getloadavg()[0]:.1f} at end")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--trace-child"]:
        _trace_child(sys.argv[2:])
    else:
        sys.exit(main())
