"""Fuzz benchmark: >= 100,000 structurally mutated inputs through the parser, the JSON readers, `report`,
GGUF headers, files of repo ids and audit cache entries.

Cases (fixtures/fuzzcase.py) mutate the bundled real-layout checkpoint (Qwen3.5 NVFP4 tiny): shard
headers (parse_header, fast path checked against the exact path), config.json / hf_quant_config.json /
the index (the JSON decoder and the readers behind the report), and whole `ckptinspect report` runs in
process through the CLI entry point on a working copy (exit 0 or 2 only, one error line, the model
directory bit-identical after). fixtures/fuzzcase_inputs.py adds byte-mutated GGUF headers (parsed whole
and grown on demand, then through the GGUF report pipeline), mutated `audit --repos-file` files and
mutated / forged audit cache entries (a miss unless untouched). fixtures/fuzzcase_net.py adds what servers
send: mutated Hub listing pages with their status and Link header (select.read_page, in process; ids must
be Hub ids, the next page on the endpoint), a smaller share of whole `audit --search` runs against a
listing server on 127.0.0.1 (exit 0 or 2, one error line, no raw control character, a listed id never read
from a local directory), and mutated engine answers (vLLM /metrics, /v1/models, completion replies, SGLang
/generate and --main-url replies) through the probe's parsing functions. Each case runs under a per-case time
bound (SIGALRM); a case over it counts as a hang. Prints the counts, uncaught exceptions, hangs, other
failures and the peak RSS.

Usage: python benchmarks/fuzz.py [--cases 100000] [--report-share 0.05] [--json-share 0.25]
       [--gguf-share 0] [--ids-share 0] [--audit-share 0] [--listing-share 0] [--listing-e2e-share 0]
       [--engine-share 0] [--seed 0]
Exit status 1 when any case failed.
"""

from __future__ import annotations

import argparse
import collections
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--report-share", type=float, default=0.05, help="share of whole `report` runs")
    parser.add_argument("--json-share", type=float, default=0.25, help="share of JSON-file cases")
    parser.add_argument("--gguf-share", type=float, default=0.0, help="share of GGUF header cases")
    parser.add_argument("--ids-share", type=float, default=0.0, help="share of `audit --repos-file` cases")
    parser.add_argument("--audit-share", type=float, default=0.0, help="share of audit cache entry cases")
    parser.add_argument("--listing-share", type=float, default=0.0, help="share of Hub listing page cases")
    parser.add_argument("--listing-e2e-share", type=float, default=0.0,
                        help="share of whole `audit --search` runs against a listing server on 127.0.0.1")
    parser.add_argument("--engine-share", type=float, default=0.0, help="share of engine answer cases")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bound", type=float, default=5.0, help="per-case time bound, seconds")
    parser.add_argument("--show", type=int, default=5, help="failures to print in full")
    args = parser.parse_args()

    from fixtures.fuzzcase import Corpus, ReportFuzzer, header_case, json_case

    from fixtures.fuzzcase_inputs import AuditEntryFuzzer, GgufCorpus, gguf_case, ids_file_case
    from fixtures.fuzzcase_net import ListingServer, engine_case, listing_case

    corpus = Corpus()
    workdir = Path(tempfile.mkdtemp(prefix="ckptinspect-fuzz-"))
    reports = ReportFuzzer(workdir, corpus)
    gguf = GgufCorpus(workdir / "gguf") if args.gguf_share else None
    entries = AuditEntryFuzzer(workdir / "audit") if args.audit_share else None
    server = ListingServer(workdir / "listing") if args.listing_e2e_share else None
    shares = [(args.report_share, lambda rng: reports.case(rng, bound_s=args.bound)),
              (args.json_share, lambda rng: json_case(corpus, rng, bound_s=args.bound)),
              (args.gguf_share, lambda rng: gguf_case(gguf, rng, bound_s=args.bound)),
              (args.ids_share, lambda rng: ids_file_case(workdir, rng, bound_s=args.bound)),
              (args.audit_share, lambda rng: entries.case(rng, bound_s=args.bound)),
              (args.listing_share, lambda rng: listing_case(rng, bound_s=args.bound)),
              # a whole audit: the listing, then one Hub request per listed repo (bounded by its own deadline)
              (args.listing_e2e_share, lambda rng: server.case(rng, bound_s=max(args.bound, 20.0))),
              (args.engine_share, lambda rng: engine_case(rng, bound_s=args.bound))]
    master = random.Random(args.seed)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures = []
    started = time.perf_counter()
    slowest = 0.0
    for i in range(args.cases):
        rng = random.Random(master.getrandbits(64))
        pick = rng.random()
        t = time.perf_counter()
        outcome = None
        for share, run in shares:
            if pick < share:
                outcome = run(rng)
                break
            pick -= share
        if outcome is None:
            outcome = header_case(corpus, rng, bound_s=args.bound)
        slowest = max(slowest, time.perf_counter() - t)
        counts[outcome.kind][outcome.status] += 1
        if not outcome.ok:
            failures.append((i, outcome))
            # said at once: a long run's failures are known (and can be replayed by index) before it ends
            print(f"  failure at case {i}: {outcome.kind} {outcome.target} {outcome.status}: "
                  f"{outcome.detail[-300:]!r}", flush=True)
        if (i + 1) % 20_000 == 0:
            print(f"  {i + 1:,} cases, {len(failures)} failures, {time.perf_counter() - started:.0f} s", flush=True)
    wall = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    total = collections.Counter()
    for kind, c in sorted(counts.items()):
        total.update(c)
        print(f"{kind:<11} {sum(c.values()):>7,} cases  " + ", ".join(f"{k} {v:,}" for k, v in sorted(c.items())))
    print(f"cases {sum(total.values()):,} in {wall:.0f} s (slowest case {slowest:.2f} s, bound {args.bound} s)")
    print(f"uncaught exceptions {total['uncaught']}, hangs {total['hang']}, bad exit codes {total['bad-exit']}, "
          f"not one line {total['not-one-line']}, model dir changed {total['changed-dir']}")
    print(f"peak RSS {peak_mb:.0f} MB")
    if server is not None:
        server.close()
    for i, outcome in failures[:args.show]:
        print(f"--- case {i}: {outcome.kind} {outcome.target} {outcome.status}\n{outcome.detail}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
