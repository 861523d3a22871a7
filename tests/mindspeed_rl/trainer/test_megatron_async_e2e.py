"""The pipelines with the megatron engine end to end: real CLI, Ray, a two-rank gloo
TrainingGroup, one vLLM actor. Checks the mechanics (exactly-once consumption, per-rank snapshot
shards merged by the GU, the layout in summary.json, a loadable final model, periodic evaluation,
megatron's distributed checkpoint and a resume from it, the hybrid loop's weight push), not
learning: the 30-iteration learning runs are reported in the README."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.models import PolicyModels
from tests.support.ray_cluster import shared_cluster_env

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow]

# 3 iterations x 4 prompts x 4 samples, one minibatch per global batch.
TINY = (
    "megatron_training.train_iters=3",
    "megatron_training.global_batch_size=4",
    "rl_config.mini_batch_size=4",
    "rl_config.n_samples_per_prompt=4",
    "actor_config.micro_batch_size=16",
    "rl_config.actor_forward_micro_batch_size=16",
    "rl_config.ref_forward_micro_batch_size=16",
    "warmup_config.steps=5",
    "asp_config.b=4",
    "asp_config.sa_iterations=1000",
    "async_config.queue_max_samples=32",
    "async_config.queue_resume_samples=16",
    "async_config.snapshot_keep=10",
    "generate_config.sampling_config.max_tokens=24",
    "rl_config.use_tensorboard=false",
)


def _run(
    tmp_path: Path, config: str, *extra: str, runs: str = "runs", models: PolicyModels | None = None
) -> Path:
    if models is not None:
        models.provide(tmp_path / "model", config, (*TINY, *extra))
    cmd = [
        sys.executable, str(ROOT / "cli" / "train_grpo.py"), "--config-name", config,
        f"run_dir={tmp_path / runs}", f"megatron_training.tokenizer_name_or_path={tmp_path / 'model'}",
        *TINY, *extra,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=shared_cluster_env()
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (run_dir,) = list((tmp_path / runs).iterdir())
    return run_dir


def _check_run(run_dir: Path, layout: dict[str, int]) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["training_layout"] == layout
    assert summary["prompts_scheduled"] == summary["prompts_consumed"] == 12
    assert summary["duplicate_minibatches_dropped"] == 0
    manifests = sorted((run_dir / "snapshots" / "trainer").glob("v*/manifest.json"))
    assert manifests, "no snapshot was published"
    num_shards = layout["tp"] * layout["pp"] * layout["ep"]
    for path in manifests:
        manifest = json.loads(path.read_text())
        assert sorted(s["rank"] for s in manifest["shards"]) == list(range(num_shards))
        assert manifest["layout"]["naming"]["scheme"] == "megatron"
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(run_dir / "final_model")
    # The GU merged the shards into HF names and shapes (whether an actor reloaded before the
    # last minibatch started depends on timing; the converted cache does not).
    final = load_file(str(run_dir / "final_model" / "model.safetensors"))
    converted = sorted((run_dir / "snapshots" / "gu0").glob("v*/rank-00000.safetensors"))
    assert converted, "the GU converted no snapshot"
    merged = load_file(str(converted[-1]))
    assert {k: v.shape for k, v in merged.items()} == {k: v.shape for k, v in final.items()}


EVAL_AND_SAVE = (
    "megatron_training.split='75,25,0'",
    "megatron_training.eval_interval=2",
    "megatron_training.eval_iters=1",
    "megatron_training.save_interval=2",
)


def test_megatron_tp2_async_run_evaluates_checkpoints_and_resumes(
    tmp_path: Path, policy_models: PolicyModels
) -> None:
    save = tmp_path / "save"
    run_dir = _run(
        tmp_path, "grpo_tiny_megatron", *EVAL_AND_SAVE, f"actor_config.save={save}", models=policy_models
    )
    _check_run(run_dir, {"tp": 2, "pp": 1, "ep": 1, "dp": 1})
    # Periodic evaluation: one row, at iteration index 1, decoded by a rollout actor that had
    # reloaded that step's snapshot (v2), not by a trainer rank.
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in rows if "eval/accuracy" in r]
    assert [r["iteration"] for r in evaluated] == [1]
    assert evaluated[0]["eval/num_samples"] == evaluated[0]["eval/num_prompts"] * 4 > 0
    assert evaluated[0]["eval/weights_version"] == 2
    # megatron's distributed checkpoint beside the HF folder, in the checkpoint after iteration 2.
    checkpoint = save / "iter_0000002"
    assert (checkpoint / "mcore_dist" / ".metadata").is_file()
    assert len(list((checkpoint / "mcore_dist").glob("*.distcp"))) == 2  # one file per rank
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(checkpoint)
    # Resume from it: the third iteration only, every prompt of the lineage consumed once.
    resumed = _run(tmp_path, "grpo_tiny_megatron", *EVAL_AND_SAVE, f"actor_config.save={tmp_path / 'save2'}",
                   f"actor_config.load={checkpoint}", runs="runs_resumed")  # fmt: skip
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["resumed_from_iteration"] == 2
    assert summary["prompts_consumed"] == 4
    assert summary["prompts_consumed_total"] == summary["prompts_consumed_unique_total"] == 12
    assert summary["training_layout"] == {"tp": 2, "pp": 1, "ep": 1, "dp": 1}


def test_megatron_tp2_hybrid_run_pushes_gathered_weights(tmp_path: Path, policy_models: PolicyModels) -> None:
    run_dir = _run(tmp_path, "grpo_tiny_megatron", "rl_config.pipeline=hybrid", models=policy_models)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["pipeline"] == "hybrid"
    assert summary["training_layout"] == {"tp": 2, "pp": 1, "ep": 1, "dp": 1}
    assert summary["prompts_consumed_total"] == summary["prompts_consumed_unique_total"] == 12
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["time/weight_sync_s"] > 0 for r in rows)


@pytest.mark.parametrize(
    ("infer_tp", "engines", "offload"),
    [
        (2, 1, "true"),
        (1, 2, "false"),
    ],
    ids=["one-tp2-engine-full-offload", "two-tp1-engines"],
)
def test_megatron_tp2_colocated_hybrid_pushes_in_process(
    tmp_path: Path, policy_models: PolicyModels, infer_tp: int, engines: int, offload: str
) -> None:
    """``rl_config.colocate`` on CPU: each trainer rank's process hosts its engine rank (vLLM's
    external launcher over the rank group), weights streamed rank to rank; after every push the
    engines' log-probs are the trainer's (fp32), and the evaluation decodes on the engines. A run
    resumed from its checkpoint generates on the checkpoint's weights."""
    keys = (
        "rl_config.pipeline=hybrid", "rl_config.colocate=true",
        f"generate_config.infer_tensor_parallel_size={infer_tp}", *EVAL_AND_SAVE,
        "rl_config.entropy_coeff=0.01",  # every step moves the weights, whatever the rewards
        *(f"generate_config.offload_train_{part}={offload}" for part in ("optimizer", "grad", "param")),
    )  # fmt: skip
    run_dir = _run(
        tmp_path, "grpo_tiny_megatron", *keys, f"actor_config.save={tmp_path / 'save'}", models=policy_models
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["colocated_engines"] == {"engines": engines, "tp": infer_tp}
    assert summary["prompts_consumed_total"] == summary["prompts_consumed_unique_total"] == 12
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    # Iterations 1 and 2 generated on pushed weights: a stale or misplaced weight would show here.
    kl = "rollout_corr/kl_k3_behave_vs_train"
    assert all(r[kl] < 1e-9 for r in rows), [r[kl] for r in rows]
    assert [r["actor/grad_norm"] > 0 for r in rows] == [True] * 3
    (evaluated,) = [r for r in rows if "eval/accuracy" in r]
    assert evaluated["eval/weights_version"] == 2 and evaluated["eval/num_samples"] > 0
    if engines == 1:
        return
    # Resume after iteration 2: the engines start from the checkpoint's weights, not the policy's.
    resumed = _run(tmp_path, "grpo_tiny_megatron", *keys, f"actor_config.load={tmp_path / 'save' / 'iter_0000002'}",
                   runs="runs_resumed")  # fmt: skip
    (row,) = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert row["iteration"] == 2 and row[kl] < 1e-9, row[kl]
    assert json.loads((resumed / "summary.json").read_text())["prompts_consumed_unique_total"] == 12


def test_megatron_moe_ep2_async_run(tmp_path: Path, policy_models: PolicyModels) -> None:
    _check_run(
        _run(tmp_path, "grpo_tiny_megatron_moe", models=policy_models), {"tp": 1, "pp": 1, "ep": 2, "dp": 2}
    )
