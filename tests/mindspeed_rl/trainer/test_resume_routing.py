"""Resume with MoE routing replay (R3): what happens to the routing of samples that sat in the
Training Queue when the checkpoint was written.

The queue is not checkpointed (``guides/resume-and-faults``): a checkpoint records the prompts
trained on, and a resumed run re-issues every other prompt of the schedule. So a queued sample's
routing is not carried over byte for byte; its prompt is generated again by the resumed policy,
whose engines record routing again (the resumed plan keeps ``record_routing``), and the new
record belongs to the weights that produced the new tokens, as R3 requires. These tests pin both
halves with the real ControlLoop, checkpoint writer/reader and plan builder."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.runtime import ControlLoop, FakeClock
from mindspeed_rl.runtime.config import RuntimeConfig
from mindspeed_rl.runtime.records import CompletedMinibatch, Sample, ScheduledMinibatch
from mindspeed_rl.runtime.routing import Routing
from mindspeed_rl.trainer import checkpointing as ckpt

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
N = 2  # samples per prompt
SCHEDULE = tuple(
    ScheduledMinibatch(
        minibatch_id=i, prompt_ids=(f"p{2 * i}", f"p{2 * i + 1}"), batch_group_id=i // 2,
        predicted_load=20.0, order_index=i,
    )
    for i in range(4)
)  # fmt: skip


def _routed(mb: ScheduledMinibatch, rng: np.random.Generator) -> CompletedMinibatch:
    """What an R3 generation actor returns: every sample carries its routing record."""
    samples = tuple(
        Sample(
            prompt_id=p, sample_index=i, minibatch_id=mb.minibatch_id, response_token_ids=(1, 2, 3),
            rollout_log_probs=(-0.1, -0.2, -0.3), reward=1.0, policy_version=0, gu_id=0, actor_id=0,
            sent_at=0.0, routing=Routing.from_array(rng.integers(0, 4, size=(6, 2, 2)), num_experts=4),
        )
        for p in mb.prompt_ids
        for i in range(N)
    )  # fmt: skip
    return CompletedMinibatch(
        minibatch_id=mb.minibatch_id, attempt=0, samples=samples, gu_id=0, actor_id=0,
        policy_version=0, started_at=0.0, finished_at=1.0,
    )  # fmt: skip


def _trainer_files(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"weights")


def test_prompts_queued_with_routing_at_a_checkpoint_are_reissued_on_resume(tmp_path: Path) -> None:
    config = RuntimeConfig(
        num_prompts_per_global_batch=2, num_samples_per_prompt=N, queue_max_samples=16,
        queue_resume_samples=8, gu_queue_low=1, gu_queue_high=3, max_policy_lag=2,
    )  # fmt: skip
    loop = ControlLoop(config=config, schedule=list(SCHEDULE), clock=FakeClock())
    loop.register_gu(0, num_actors=1)
    rng = np.random.default_rng(0)
    for assignment in loop.dispatch()[:2]:
        mb = assignment.minibatch
        assert loop.request_start(mb.minibatch_id, attempt=0, gu_id=0, actor_id=0, policy_version=0).granted
        loop.on_minibatch_completed(_routed(mb, rng))
    batch = loop.pop_global_batch(0)
    assert batch is not None
    lineage = ckpt.Lineage(SCHEDULE, None)
    lineage.record(0, [g.prompt_id for g in batch.prompts])
    loop.on_train_step_done(0)
    queued = {q.group.prompt_id for q in loop.queue.candidates(loop.queue.depth_prompts)}
    assert queued and loop.queue.routing_bytes == len(queued) * N * 6 * 2 * 2  # routed samples wait

    fingerprint = {"pipeline": "async"}
    ckpt.write_checkpoint(
        tmp_path, lineage.state(1), schedule=lineage.schedule, fingerprint=fingerprint,
        write_trainer_state=_trainer_files,
    )  # fmt: skip
    point = ckpt.load_resume_point(tmp_path, fingerprint)
    reissued = {p for mb in point.remaining_schedule for p in mb.prompt_ids}
    # The queued prompts come back to be generated again (with fresh routing); the trained ones do not.
    assert queued <= reissued
    assert not reissued & {g.prompt_id for g in batch.prompts}
    assert reissued == {p for mb in SCHEDULE for p in mb.prompt_ids} - set(point.prompts_consumed)


def test_a_resumed_r3_run_records_routing_again(tmp_path: Path) -> None:
    """The resumed run's plan: a resume (not a finetune), R3 on the trainer, and engines that
    record the routing of everything they generate, the re-issued prompts included."""
    overrides = [
        f"++actor_config.load={tmp_path}", "++rl_config.routing_replay=R3", "++rl_config.rollout_backend=hf",
    ]  # fmt: skip
    plan = build_run_plan(load_config_from_files(CONFIGS, "grpo_tiny_megatron_moe", overrides))
    assert plan.checkpoint.resume_dir == str(tmp_path)
    assert plan.trainer.routing_replay == "R3"
    assert plan.rollout.record_routing
    off = build_run_plan(load_config_from_files(CONFIGS, "grpo_tiny_megatron_moe", overrides[:1]))
    assert not off.rollout.record_routing  # the test tells the two apart
    # The fingerprint does not hold the replay mode: a run may resume with replay switched on or off,
    # since no routing is carried over.
    assert "routing_replay" not in ckpt.run_fingerprint(plan)
