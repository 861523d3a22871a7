"""``async_config``: the asynchronous TU/GU/CU pipeline (used when rl_config.pipeline = async)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mindspeed_rl.config_cls.fields import opt, section
from mindspeed_rl.config_cls.resources import ActorResources


@dataclass(frozen=True, slots=True, kw_only=True)
class AsyncConfig:
    """Generation units, queues, backpressure and the weight flow. Queue sizes state their units."""

    num_generation_units: int = opt(1, "Generation Units (GUs), each with its control process.")
    actors_per_unit: int = opt(1, "Generation actors (rollout engines) per GU.")
    actor_tensor_parallel_size: int = opt(1, "TP of each generation actor.")
    actor_expert_parallel_size: int = opt(1, "EP of each generation actor (MoE).")
    actor_resources: ActorResources = section(ActorResources, "Ray request of each generation actor.")
    trainer_resources: ActorResources = section(
        ActorResources, "Ray request of each Training Unit worker (torch backend: one worker)."
    )
    control_resources: ActorResources = section(
        ActorResources, "Ray request of each control actor (GU control process, Training Queue)."
    )
    gu_queue_low: int = opt(5, "MINIBATCHES: refill a GU's input queue below this (paper: 5-10).")
    gu_queue_high: int = opt(10, "MINIBATCHES: fill a GU's input queue up to this.")
    queue_max_samples: int = opt(512, "SAMPLES (Q_max): above this GUs stop starting minibatches.")
    queue_resume_samples: int = opt(256, "SAMPLES: generation resumes once the queue drains below this.")
    snapshot_interval: int = opt(1, "Training steps between weight snapshots.")
    snapshot_dir: str | None = opt(
        None,
        "Snapshot folder (shared by TU and GUs); each run writes under <snapshot_dir>/<run dir name>/, "
        "so reruns into one folder never prune each other's versions; null = <run_dir>/snapshots.",
    )
    snapshot_keep: int = opt(3, "Snapshots kept; older ones are deleted (>= 2 so a loading one survives).")
    max_policy_lag: int | None = opt(
        4,
        "Hard cap on (trainer version - sample's policy version) at consumption; null switches the "
        "bound off (backpressure alone limits staleness, as in the paper).",
    )
    minibatch_timeout_s: float | None = opt(
        None,
        "SECONDS one minibatch may generate; past it the GU kills the actor, re-issues the minibatch "
        "and starts a replacement (counted as minibatches_timed_out). null = off (a hung engine is "
        "then caught only by stall_timeout_s, which fails the run).",
    )
    actor_max_restarts: int = opt(
        3, "Replacements per actor slot after it raised, timed out or died; then the slot is retired."
    )
    minibatch_max_attempts: int = opt(
        3, "Failed attempts after which a minibatch is poison: the run stops naming it and its prompts."
    )
    stall_timeout_s: float | None = opt(
        900.0,
        "SECONDS without progress (completion, popped batch, trained step, snapshot) after which the "
        "run fails naming the stuck unit and the reason; must exceed minibatch_timeout_s; null = off.",
    )
    weight_transport: Literal["shared_fs", "object_store"] = opt(
        "shared_fs", "shared_fs = snapshot files; object_store = Ray object store (no shared disk)."
    )
