"""What a valid config does that a reader of its YAML might not expect, said once at start-up
(``train_grpo.py`` logs these, ``check_config`` prints them on stderr). Not problems: upstream
runs these configs the same way."""

from __future__ import annotations

from mindspeed_rl.config_cls.grpo_config import GRPOConfig


def batch_notes(config: GRPOConfig) -> tuple[str, ...]:
    """Upstream's batch semantics where they differ from the keys' plain reading."""
    rl = config.rl_config
    step, gbs = config.num_prompts_per_step, config.num_prompts_per_global_batch
    notes = []
    if rl.filter_groups_enable and step != gbs:
        notes.append(
            f"dynamic sampling generates in batches of global_batch_size {gbs} prompts, keeps the groups "
            f"whose {rl.filter_groups_metric!r} scores differ, and trains one iteration on every "
            f"filter_groups_train_batch_size {step} kept prompts (train_iters counts these iterations)"
        )
    if rl.mini_batch_size > step:
        what = "filter_groups_train_batch_size" if rl.filter_groups_enable else "global_batch_size"
        notes.append(
            f"rl_config.mini_batch_size {rl.mini_batch_size} prompts is more than the {step} prompts one "
            f"iteration trains ({what}): as upstream, each iteration is one optimizer step on its "
            f"{step} prompts x n_samples_per_prompt {rl.n_samples_per_prompt} samples"
        )
    return tuple(notes)
