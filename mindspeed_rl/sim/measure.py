"""Time fixed-length decodes on a real rollout engine, to feed ``fit_decode`` (optional, slow).

Every call generates exactly ``S`` tokens per sequence (``min_tokens = max_tokens = S``, EOS
ignored), so the run's ``(batch size, steps, seconds)`` is what the decode model's fit expects.
On this CPU it runs the tiny Qwen3 model created from ``configs/model/tiny_qwen3.yaml``; on a
cluster, point ``model_dir`` at the real policy and use the vLLM backend.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mindspeed_rl.sim.fit import DecodeRun

TINY_ARCH_YAML = Path(__file__).resolve().parents[2] / "configs" / "model" / "tiny_qwen3.yaml"


def tiny_arch(path: str | Path = TINY_ARCH_YAML) -> Mapping[str, Any]:
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, Mapping) or "tiny_qwen3" not in data:
        raise ValueError(f"{path} must hold a 'tiny_qwen3' mapping (the tiny model's architecture).")
    return dict(data["tiny_qwen3"])


def measure_decode_runs(
    model_dir: str | Path,
    *,
    backend: str = "hf",
    batch_sizes: Sequence[int] = (1, 4, 16),
    steps: Sequence[int] = (16, 64),
    prompt_tokens: int = 8,
    repeats: int = 1,
    seed: int = 0,
) -> list[DecodeRun]:
    """One ``DecodeRun`` per (batch size, steps, repeat), after one untimed warm-up call."""
    from mindspeed_rl.models.rollout import SamplingConfig, build_rollout_engine

    if not batch_sizes or not steps or repeats < 1 or prompt_tokens < 1:
        raise ValueError("give at least one batch size and step count, repeats >= 1 and prompt_tokens >= 1.")
    max_len = prompt_tokens + max(steps)
    config: dict[str, Any] = {"max_num_seqs": max(batch_sizes), "max_model_len": max_len, "dtype": "float32"}
    engine = build_rollout_engine(backend, str(model_dir), config, seed=seed)
    prompt = [5 + (i % 40) for i in range(prompt_tokens)]
    try:
        _generate(engine, SamplingConfig, [prompt], min(steps), seed)
        runs = []
        for _ in range(repeats):
            for batch in batch_sizes:
                for num_steps in steps:
                    t0 = time.perf_counter()
                    _generate(engine, SamplingConfig, [prompt] * batch, num_steps, seed)
                    runs.append(
                        DecodeRun(batch_size=batch, num_steps=num_steps, seconds=time.perf_counter() - t0)
                    )
        return runs
    finally:
        engine.shutdown()


def _generate(engine: Any, sampling_cls: Any, prompts: list[list[int]], num_steps: int, seed: int) -> None:
    sampling = sampling_cls(
        max_tokens=num_steps, min_tokens=num_steps, ignore_eos=True, temperature=1.0, seed=seed
    )
    out = engine.generate(prompts, sampling, n=1)
    lengths = {len(c.token_ids) for group in out for c in group}
    assert lengths == {num_steps}, f"engine did not decode exactly {num_steps} tokens: {sorted(lengths)}"
