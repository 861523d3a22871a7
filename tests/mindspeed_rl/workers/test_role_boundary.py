"""What crosses between the trainer's and the rollout's environments is builtins and this
project's records only (``utils.portable``): checked on the records the real workers make, a
generation actor on the HF engine with dynamic sampling's filter score and a held-out decode,
the prompt records the driver loads, the global batch the Control Unit assembles from them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mindspeed_rl.models.tiny import TINY_TEST_ARCH, create_tiny_model
from mindspeed_rl.runtime.records import GlobalBatch, PromptGroup, ScheduledMinibatch
from mindspeed_rl.trainer.prompts import load_run_split
from mindspeed_rl.utils.portable import foreign_modules, modules_needed
from mindspeed_rl.workers.evaluator import EvalRequest, EvalSettings
from mindspeed_rl.workers.generation_actor import GenerationActor
from tests.support.plans import hf_rollout_spec, small_async_plan


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return create_tiny_model(tmp_path_factory.mktemp("boundary") / "model", TINY_TEST_ARCH, seed=0)


@pytest.fixture(scope="module")
def prompts(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Prompt records as the driver loads them (tokenized builtin:demo prompts)."""
    plan = small_async_plan(f"megatron_training.tokenizer_name_or_path={model_dir}")
    splits = load_run_split(plan.data, str(model_dir), tmp_path_factory.mktemp("run"))
    return {r.prompt_id: r for r in splits.train[:4]}


def test_the_checker_names_what_a_role_boundary_cannot_carry() -> None:
    assert foreign_modules({"a": (1, 2.0, "x", None)}) == set()
    assert "torch._utils" in modules_needed(torch.ones(2)) and foreign_modules(torch.ones(2))
    assert any(m.startswith("numpy") for m in foreign_modules(np.float32(1.0)))
    assert any(m.startswith("numpy") for m in foreign_modules([np.arange(3)]))


def test_what_a_generation_actor_hands_back_is_portable(model_dir: Path, prompts: dict[str, object]) -> None:
    spec = hf_rollout_spec(
        model_dir, "generate_config.sampling_config.max_tokens=4", "++rl_config.filter_groups_enable=true",
        "rl_config.verifier_function=[demo,demo_exact]", "rl_config.verifier_weight=[1.0,0.0]",
        "++rl_config.filter_groups_metric=demo_exact", "++rl_config.filter_groups_train_batch_size=32",
    )  # fmt: skip
    assert spec.filter_scorer is not None
    actor = GenerationActor(spec, str(model_dir), prompts, gu_id=0, actor_id=0)
    minibatch = ScheduledMinibatch(
        minibatch_id=0, prompt_ids=tuple(prompts), batch_group_id=0, predicted_load=1.0, order_index=0
    )
    done = actor.generate_minibatch(minibatch, sent_at=1.0)
    assert all(s.filter_score is not None for s in done.samples)
    assert foreign_modules(done) == set()
    decoded = actor.decode_held_out(
        EvalRequest(
            prompts=tuple(prompts.values()),
            settings=EvalSettings(sampling=spec.sampling, num_samples_per_prompt=2, seed=0),
        ).job(0, 0)
    )
    assert foreign_modules(decoded) == set()
    # What the Control Unit hands the trainer: the samples grouped per prompt, with the records.
    groups = tuple(
        PromptGroup(
            prompt_id=pid, minibatch_id=0, samples=tuple(s for s in done.samples if s.prompt_id == pid)
        )
        for pid in prompts
    )
    batch = GlobalBatch(step=0, prompts=groups, records=tuple(prompts.values()))
    assert foreign_modules(batch) == set()


def test_prompt_records_are_portable(prompts: dict[str, object]) -> None:
    assert prompts and foreign_modules(list(prompts.values())) == set()
