"""``ProbeOptions``: every option of one probe run (``api.probe``, ``runner.run_probe``, ``engine_client.run_engine``)
as one frozen, typed record, checked where it is made.

Torch-free (it imports only ``ckptinspect.errors``): the CLI builds one through ``ckptinspect.api`` before
torch is imported, so an option that cannot run fails before any model is read. Its ``__post_init__``
holds the checks that need neither torch nor the checkpoint; what needs them (a device torch cannot see,
a category the prompt set lacks, the memory estimate) stays in the runner. Sequences are tuples, so an
options object can be shared and hashed. Test-only hooks (``run_probe``'s ``head_factory``) are keywords
of the runner, not options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptinspect.errors import ProbeError

if TYPE_CHECKING:
    from ckptinspect.plan import GpuSpec

MODES = ("greedy", "teacher")
# greedy mode's transformers generation (sequences.generate_sequences; Settings.probe_generate)
GENERATE_MODES = ("eager", "static")
# transformers' MoE experts kernels (loader.set_experts_implementation)
EXPERTS_IMPLEMENTATIONS = ("auto", "eager", "grouped_mm", "batched_mm")
# In-process defaults of the options whose None means "this path's default": the engine path keeps the
# server's K and records temperature 0.0 (it decodes greedily).
DEFAULT_STEPS = 3
DEFAULT_TEMPERATURE = 1.0
DEFAULT_GENERATE = "eager"


@dataclass(frozen=True)
class ProbeOptions:
    """One probe run's options; every field has the default the CLI and ``run_probe`` use.

    ``dataclasses.replace(options, steps=2)`` makes a variant (checked again); ``run_probe(model, options,
    steps=2)`` does the same, and an unknown name is a ``TypeError``.
    """

    # -- where the main model runs --------------------------------------------------------------------
    # device: "cuda:N" or "cpu" (the CLI's default: cuda:0 when a GPU is visible, else cpu).
    # devices: spread the main model over these GPU indices, e.g. (0, 1) (device_map "auto"; overrides device).
    # dtype: compute dtype, "bf16" / "fp16" / "fp32" (None: bf16 on GPU, fp32 on CPU).
    # trust_remote_code: allow the checkpoint's own Python code; never implied.
    # experts_implementation: transformers' MoE experts kernels, one of EXPERTS_IMPLEMENTATIONS; "auto" is
    #   transformers' default (grouped_mm, batched_mm while decoding on GPU).
    # generate: greedy mode's transformers generation, "eager" or "static" (GENERATE_MODES); None: eager,
    #   and api.probe fills in Settings.probe_generate (CKPTINSPECT_PROBE_GENERATE).
    device: str = "cpu"
    devices: tuple[int, ...] | None = None
    dtype: str | None = None
    trust_remote_code: bool = False
    experts_implementation: str = "auto"
    generate: str | None = None

    # -- a main model served elsewhere ----------------------------------------------------------------
    # main_url: a running SGLang server (--enable-return-hidden-states) is the main model; greedy mode only,
    #   the MTP head still runs in process.
    # engine: base URL of a running SGLang or vLLM server started with MTP speculative decoding; the engine
    #   measures acceptance with its own counts (greedy; vLLM: --per-request-spec-decode-metrics detailed),
    #   and the checkpoint gives tokenizer, readiness and cost model. Only api.probe / run_engine read it.
    # engine_kind: the engine the user named ("sglang" / "vllm"), checked against what the server says it
    #   is (None: whichever answers).
    main_url: str | None = None
    engine: str | None = None
    engine_kind: str | None = None

    # -- what is measured ------------------------------------------------------------------------------
    # prompts: .txt (one prompt per line) or .jsonl ({prompt, category}); None: the built-in set.
    # categories: only prompts of these categories (built-in: chat, code, math, reasoning, summarisation,
    #   multilingual); "synthetic" adds benchmark-style token-id prompts of synthetic_len tokens
    #   (synthetic.py; vLLM / SGLang random datasets default to 1024).
    # max_prompts: use only the first N prompts.
    # max_new_tokens: tokens each prompt's greedy continuation runs to.
    # steps: draft depth K, the one MTP layer chained K times (1..16); None: 3 in process, and through an
    #   engine the server's own K (a given K the server does not draft is an error).
    # mode: "greedy" scores the main model's own greedy continuations; "teacher" scores a fixed text
    #   (the prompts, corpus or continuations) in one forward pass, and streams the layers of a main
    #   model that does not fit the device.
    # temperature: temperature of the sampled-acceptance estimate sum(min(p, q)); None: 1.0 in process,
    #   0.0 through an engine (it decodes greedily).
    # corpus: teacher mode scores this text (.txt, documents split at blank lines; .jsonl with 'text').
    # continuations: teacher mode scores continuations saved by save_continuations_to (no generation).
    # save_continuations_to: greedy mode also writes the main model's greedy continuations here (.jsonl).
    prompts: str | None = None
    categories: tuple[str, ...] | None = None
    max_prompts: int | None = None
    synthetic_len: int = 1024
    max_new_tokens: int = 128
    steps: int | None = None
    mode: str = "greedy"
    temperature: float | None = None
    corpus: str | None = None
    continuations: str | None = None
    save_continuations_to: str | None = None

    # -- memory ----------------------------------------------------------------------------------------
    # batch_size: sequences per batch; None: greedy mode batches the most prompts whose memory estimate
    #   fits 90% of the free device memory (runner.auto_batch), teacher mode sizes each batch of its
    #   length-sorted sequences that way (scoring.plan_batches), so memory is bounded whatever the corpus.
    # max_gpu_memory: GiB the main model may use on the device; a model over it is layer-streamed
    #   (teacher mode).
    # memory_limit / host_memory_limit: device / host bytes to plan for instead of those measured (lets
    #   tests exercise the checks); None: measured, and api.probe fills in Settings.probe_memory_limit /
    #   probe_host_memory_limit (CKPTINSPECT_PROBE_MEMORY_LIMIT / ..._HOST_MEMORY_LIMIT).
    # stream_chunk_tokens: a layer-streamed run's padded tokens per chunk at most (None: the streamer's
    #   default; the run takes the largest chunk that fits). stream_store: where its hidden states live
    #   between layers, "auto", "device" or "host" (streamed_run.STORES).
    batch_size: int | None = None
    max_gpu_memory: float | None = None
    memory_limit: int | None = None
    host_memory_limit: int | None = None
    stream_chunk_tokens: int | None = None
    stream_store: str = "auto"

    # -- cost model and output -------------------------------------------------------------------------
    # gpu: GPU name, alias or nvidia-smi name for the cost model, or a GpuSpec (api.find_gpu, --gpu-spec).
    # cost_calibration: cost-model efficiencies measured on the GPU (JSON written by benchmarks/probe_gpu.py).
    # progress: progress bars on stderr.
    gpu: "str | GpuSpec" = "H200"
    cost_calibration: str | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("devices", "categories"):  # sequences as tuples (a str is kept as given)
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, tuple)):
                object.__setattr__(self, name, tuple(value))
        if self.engine:
            # the engine measures greedy decoding on the server; the in-process options are not read
            if self.main_url or self.mode != "greedy":
                raise ProbeError("--engine measures greedy decoding on the server: no --main-url, no --mode teacher")
            return
        self._check_in_process()

    def _check_in_process(self) -> None:
        """What run_probe refuses before it reads anything."""
        if self.mode not in MODES:
            raise ProbeError(f"unknown mode {self.mode!r} (greedy or teacher)")
        if self.generate is not None and self.generate not in GENERATE_MODES:
            raise ProbeError(f"unknown generate mode {self.generate!r} ({' or '.join(GENERATE_MODES)})")
        if self.experts_implementation not in EXPERTS_IMPLEMENTATIONS:
            raise ProbeError(f"unknown experts implementation {self.experts_implementation!r} "
                             f"(one of {', '.join(EXPERTS_IMPLEMENTATIONS)})")
        if self.steps is not None and not 1 <= self.steps <= 16:
            raise ProbeError("--steps must be between 1 and 16")
        if (self.corpus or self.continuations) and self.mode != "teacher":
            raise ProbeError("--corpus and --continuations score a fixed text: they need --mode teacher")
        if self.corpus and self.continuations:
            raise ProbeError("give --corpus or --continuations, not both")
        if self.save_continuations_to and self.mode != "greedy":
            raise ProbeError("--save-continuations records greedy continuations: it needs --mode greedy")

    @property
    def draft_steps(self) -> int:
        """``steps`` as the in-process probe runs it."""
        return DEFAULT_STEPS if self.steps is None else self.steps

    @property
    def sampling_temperature(self) -> float:
        """``temperature`` as the in-process probe uses it."""
        return DEFAULT_TEMPERATURE if self.temperature is None else self.temperature

