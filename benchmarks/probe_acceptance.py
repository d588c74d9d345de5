"""GPU acceptance run of `ckptinspect probe` (issue 33): every probe mode through the CLI, each in a
fresh process, as a user runs it; one table; the numbers appended to BENCHMARKS.md.

    python benchmarks/probe_acceptance.py --out DIR [--parts dense,q397] [--commit SHA] [--no-append]

(scripts/gpu_acceptance.sh runs it with its defaults.) Parts:
  dense  a random DeepSeek-V3-shaped MoE (2.7B, one MTP layer; benchmarks/probe_gpu.py builds it):
         transformers' own ``generate(use_mtp=True)`` (the baseline, its own process), then
         ``probe --mode greedy`` (defaults: every built-in prompt, 256 new tokens), ``probe --mode
         teacher --corpus`` on the real-text corpus, and ``probe --categories synthetic``
  q397   the nvidia/Qwen3.5-397B-A17B-NVFP4 layout at full width, 4 of its 60 layers
         (benchmarks/probe_gpu_q397.py), ``probe --mode teacher --corpus`` layer-streamed at
         ``--max-gpu-memory`` 70, 60 and 40 (the shards dropped from the page cache before each run);
         per-layer wall against read time and the 60-layer extrapolation
  engine ``probe --engine`` needs a running vLLM or SGLang server: run when one of them imports, else
         reported as skipped

The corpus: whole files of Python's own standard library sources (the interpreter running this),
1-16 KB each, in name order, until 400 KB (real text, the same on every machine with the same Python).
The models have random weights: the runs measure time, bytes and memory, not acceptance.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
WORK = os.environ.get("PROBE_BENCH_WORK", "/tmp/probe-acceptance")
CORPUS_BYTES = 400_000
BUDGETS_GIB = (70, 60, 40)
TARGETS = {"greedy_x": 100.0, "teacher_prefill_fraction": 0.5, "wall_over_read": 1.15, "extrapolated_60_layers_s": 210.0}


def corpus_file(path: str, min_bytes: int = CORPUS_BYTES) -> dict:
    """A .jsonl corpus of whole standard-library source files (category ``code``)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    files = []
    for dirpath, dirnames, names in os.walk(stdlib):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "test", "tests", "__pycache__"))
        files += [os.path.join(dirpath, n) for n in sorted(names) if n.endswith(".py")]
    total, docs = 0, []
    for f in files:
        size = os.path.getsize(f)
        if not 1024 <= size <= 16384:
            continue
        text = open(f, encoding="utf-8", errors="replace").read()
        docs.append(json.dumps({"text": text, "category": "code"}))
        total += len(text.encode())
        if total >= min_bytes:
            break
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(docs) + "\n")
    return {"path": path, "documents": len(docs), "bytes": total, "source": f"Python {sys.version.split()[0]} stdlib"}


def sh(cmd: list[str], log: str, timeout: float = 1800) -> tuple[int, float, str]:
    """Run ``cmd`` in a fresh process; (exit code, wall seconds, its stderr tail)."""
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(cmd)}\n[exit {proc.returncode}, {wall:.1f} s]\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}\n")
    return proc.returncode, wall, proc.stderr.strip()[-600:]


def drop_cache(path: str) -> None:
    for name in os.listdir(path):
        p = os.path.join(path, name)
        if os.path.isfile(p):
            fd = os.open(p, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def probe(model: str, out_json: str, log: str, *args: str) -> dict:
    """``ckptinspect probe MODEL ARGS --format json -q -o OUT`` in a fresh process."""
    cmd = [sys.executable, "-m", "ckptinspect", "probe", model, "--format", "json", "-q", "-o", out_json, *args]
    code, wall, err = sh(cmd, log)
    if code != 0:
        return {"command": " ".join(cmd[2:]), "exit": code, "error": err, "process_wall_s": wall}
    doc = json.load(open(out_json))
    depth1 = doc["overall"]["depths"][0]
    row = {"command": " ".join(["ckptinspect", *cmd[4:]]), "exit": 0, "process_wall_s": wall,
           "elapsed_s": doc["elapsed_s"], "scored": depth1["scored"], "tokens_scored": doc.get("tokens_scored"),
           "timings_s": doc.get("timings_s"), "batch_size": doc.get("batch_size"),
           "peak_bytes_by_phase": doc.get("peak_bytes_by_phase"), "throughput": doc.get("throughput"),
           "memory_estimate_bytes": doc.get("memory_estimate_bytes"), "main_source": doc["main_model"]["source"]}
    if "streaming" in doc:
        row["streaming"] = doc["streaming"]
    return row


def in_process(source: str, log: str) -> dict:
    """A benchmark helper in its own process (it prints one ``RESULT {json}`` line last)."""
    paths = [ROOT, BENCH, os.path.join(ROOT, "fixtures", "probe")]
    code, _, err = sh([sys.executable, "-c", f"import sys; sys.path[:0] = {paths!r}\n" + source], log)
    if code != 0:
        return {"exit": code, "error": err}
    last = open(log, encoding="utf-8").read().rstrip().splitlines()
    for line in reversed(last):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"exit": code, "error": "no RESULT line"}


def dense(results: dict, corpus: str, log: str, out: str, save=lambda: None) -> None:
    path = os.path.join(WORK, "deepseek2b")
    results["dense_build"] = in_process(
        f"import json, probe_gpu\nprobe_gpu.WORK = {WORK!r}\nprint('RESULT ' + json.dumps(probe_gpu.build_deepseek({path!r})))",
        log)
    save()
    results["hf_mtp"] = in_process(
        f"import json, probe_gpu\nprint('RESULT ' + json.dumps(probe_gpu.hf_mtp({path!r})))", log)
    save()
    results["greedy"] = probe(path, os.path.join(out, "greedy.json"), log, "--mode", "greedy", "--steps", "3",
                              "--max-new-tokens", "256")
    save()
    results["teacher"] = probe(path, os.path.join(out, "teacher.json"), log, "--mode", "teacher", "--corpus", corpus)
    save()
    results["synthetic"] = probe(path, os.path.join(out, "synthetic.json"), log, "--categories", "synthetic",
                                 "--max-new-tokens", "64")
    save()


def q397(results: dict, corpus: str, log: str, out: str, budgets=BUDGETS_GIB, save=lambda: None) -> None:
    path = os.path.join(WORK, "q397-trunc")
    results["q397_build"] = in_process(
        f"import json, probe_gpu_q397\nprint('RESULT ' + json.dumps(probe_gpu_q397.build({path!r})))", log)
    for gib in budgets:
        drop_cache(path)
        row = probe(path, os.path.join(out, f"q397_{gib}.json"), log, "--mode", "teacher", "--corpus", corpus,
                    "--max-gpu-memory", str(gib))
        if "streaming" in row:
            row["extrapolation"] = extrapolate(row)
        results[f"q397_{gib}"] = row
        save()
    import shutil

    shutil.rmtree(path, ignore_errors=True)  # 31 GB


def extrapolate(row: dict) -> dict:
    """The 60-layer run (45 linear-attention + 15 full-attention layers) from the 4 measured (layers
    0-2 linear, 3 full): the load, layer 0 as measured (its read has nothing to overlap), 44 linear
    layers at the median wall of layers 1-2, 15 full at layer 3's, and the rest as measured."""
    per = row["streaming"]["per_layer"]
    t = row["timings_s"]
    walls = [r["wall_s"] for r in per]
    linear = sorted(walls[1:3])[len(walls[1:3]) // 2] if len(walls) >= 3 else walls[0]
    full = walls[3] if len(walls) >= 4 else walls[-1]
    outside = t.get("hidden_forward", 0.0) - sum(walls)  # the final norm, the store's copies
    total = t.get("load", 0.0) + walls[0] + 44 * linear + 15 * full + outside + t.get("mtp_chain", 0.0) + t.get("walk", 0.0)
    return {"seconds": total, "linear_layer_wall_s": linear, "full_layer_wall_s": full, "first_layer_wall_s": walls[0],
            "read_s_per_layer": [r["read_s"] for r in per], "wall_s_per_layer": walls}


def engine(results: dict) -> None:
    for module in ("vllm", "sglang"):
        try:
            __import__(module)
        except Exception:  # noqa: BLE001 - any failure to import means: not available here
            continue
        results["engine"] = {"skipped": f"{module} imports, but this script starts no server: run tests/"
                                        "test_engine_vllm.py (probe --engine against a real server)"}
        return
    results["engine"] = {"skipped": "neither vLLM nor SGLang is installed here (probe --engine needs a running server)"}


def table(r: dict) -> list[str]:
    rows = [("run", "result", "target", "met")]
    base = r.get("hf_mtp", {}).get("samples_per_s")
    if base:
        rows.append(("transformers generate(use_mtp=True)", f"{base:.2f} draft samples/s", "baseline", ""))
    g = r.get("greedy", {})
    if g.get("exit") == 0:
        rate = g["scored"] / g["elapsed_s"]
        x = rate / base if base else None
        rows.append(("probe --mode greedy", f"{rate:.0f} samples/s = {x:.1f}x, batch {g['batch_size']}" if x else
                     f"{rate:.0f} samples/s", f">= {TARGETS['greedy_x']:.0f}x", _met(x, TARGETS["greedy_x"], True)))
    elif g:
        rows.append(("probe --mode greedy", f"exit {g['exit']}: {g['error'][-120:]}", "", "no"))
    t = r.get("teacher", {})
    if t.get("exit") == 0:
        tp = t.get("throughput") or {}
        frac = tp.get("fraction_of_prefill")
        rows.append(("probe --mode teacher (corpus)", f"{t['tokens_scored'] / t['elapsed_s']:.0f} tokens/s end to end; "
                     f"{tp.get('probe_tokens_per_s', 0):.0f} scoring vs prefill {tp.get('prefill_tokens_per_s', 0):.0f}"
                     f" tokens/s = {frac if frac is None else f'{frac:.0%}'}",
                     f">= {TARGETS['teacher_prefill_fraction']:.0%} of prefill",
                     _met(frac, TARGETS["teacher_prefill_fraction"], True)))
    elif t:
        rows.append(("probe --mode teacher (corpus)", f"exit {t['exit']}: {t['error'][-120:]}", "", "no"))
    s = r.get("synthetic", {})
    if s:
        rows.append(("probe --categories synthetic", f"{s['scored']} samples in {s['elapsed_s']:.1f} s" if s.get("exit") == 0
                     else f"exit {s['exit']}: {s['error'][-120:]}", "completes", "yes" if s.get("exit") == 0 else "no"))
    for gib in sorted((int(k[5:]) for k in r if k.startswith("q397_") and k[5:].isdigit()), reverse=True):
        q = r.get(f"q397_{gib}")
        if not q:
            continue
        name = f"397B layout streamed, --max-gpu-memory {gib}"
        if q.get("exit") != 0:
            rows.append((name, f"exit {q['exit']}: {q['error'][-160:]}", "completes", "no"))
            continue
        st, ex = q["streaming"], q["extrapolation"]
        ov = st.get("overlap", {})
        peak = st.get("peak_bytes", 0) / 2**30
        pieces = f" (longer documents in pieces of {st['piece_tokens']})" if st.get("piece_tokens") else ""
        att = q.get("attention") or {}
        sliced = f", chain in slices of {att['start_slice']}+ starts" if att.get("sliced_batches") else ""
        est = (st.get("estimate_bytes") or {}).get("total", 0) / 2**30
        rows.append((name, f"{q['tokens_scored']} tokens in {q['elapsed_s']:.0f} s; chunk {st.get('chunk_tokens')}"
                     f"{pieces}{sliced}, store {st['store']}; wall/read {ov.get('wall_over_read_median')}; 60 layers ~{ex['seconds']:.0f} s; "
                     f"peak {peak:.1f} GiB (estimate {est:.1f})", f"wall/read <= {TARGETS['wall_over_read']}, 60 layers <= "
                     f"{TARGETS['extrapolated_60_layers_s']:.0f} s, peak <= {gib} GiB",
                     "yes" if (ov.get("wall_over_read_median") or 9) <= TARGETS["wall_over_read"]
                     and ex["seconds"] <= TARGETS["extrapolated_60_layers_s"] and peak <= gib else "no"))
    e = r.get("engine")
    if e:
        rows.append(("probe --engine", e.get("skipped", "ran"), "", "skipped" if "skipped" in e else ""))
    width = [max(len(row[i]) for row in rows) for i in range(4)]
    return ["| " + " | ".join(c.ljust(width[i]) for i, c in enumerate(row)) + " |" for row in rows[:1]] + [
        "| " + " | ".join("-" * w for w in width) + " |"] + [
        "| " + " | ".join(c.ljust(width[i]) for i, c in enumerate(row)) + " |" for row in rows[1:]]


def _met(value, target, higher: bool) -> str:
    if value is None:
        return "not measured"
    return "yes" if (value >= target if higher else value <= target) else "no"


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown GPU"


def commit_of(given: str | None) -> str:
    if given:
        return given
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              timeout=30).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="dense,q397,engine")
    ap.add_argument("--budgets", default=",".join(str(b) for b in BUDGETS_GIB))
    ap.add_argument("--commit", default=None)
    ap.add_argument("--benchmarks-md", default=os.path.join(ROOT, "BENCHMARKS.md"))
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--table-from", default=None, help="print the table (and append it) of an earlier acceptance.json")
    args = ap.parse_args()
    if args.table_from:
        report(json.load(open(args.table_from)), args)
        return
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(WORK, exist_ok=True)
    log = os.path.join(args.out, "acceptance.log")
    import torch
    import transformers

    r: dict = {"env": {"gpu": gpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "commit": commit_of(args.commit), "torch": torch.__version__,
                       "transformers": transformers.__version__, "python": sys.version.split()[0]}}
    r["corpus"] = corpus_file(os.path.join(WORK, "corpus.jsonl"))
    parts = args.parts.split(",")
    r["parts"] = parts

    def save():
        with open(os.path.join(args.out, "acceptance.json"), "w") as fh:
            json.dump(r, fh, indent=1, default=str)

    for part in parts:
        if part == "dense":
            dense(r, r["corpus"]["path"], log, args.out, save)
        elif part == "q397":
            q397(r, r["corpus"]["path"], log, args.out, tuple(int(b) for b in args.budgets.split(",")), save)
        save()
    if "engine" in parts:
        engine(r)
    save()
    report(r, args)


def report(r: dict, args) -> None:
    lines = table(r)
    env = r["env"]
    parts = r.get("parts", [])
    head = (f"`scripts/gpu_acceptance.sh` ({','.join(parts)}) on {env['gpu']}, {env['date']}, commit {env['commit']}, "
            f"torch {env['torch']}, transformers {env['transformers']}; corpus: {r['corpus']['documents']} whole files, "
            f"{r['corpus']['bytes']:,} bytes of the {r['corpus']['source']} sources")
    print(head)
    print("\n".join(lines))
    if not args.no_append:
        with open(args.benchmarks_md, "a", encoding="utf-8") as fh:
            fh.write(f"\n### Probe acceptance run, {env['date']}\n\n{head}:\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
