"""Two Ray nodes whose snapshot folders are different directories (``ray.cluster_utils.Cluster``):
nothing is shared between the trainer's node and the generation node.

- ``shared_fs``: the real Generation Unit's start-up probe refuses it, naming the key and the node.
- ``object_store`` and ``collective``: the trainer's node exports two refreshes through the real
  exporters; on the other node the GU's end (``Transport.gu_end``) converts them and a real generation
  actor (HF engine) reloads each from memory. After each reload its greedy log-probs are those
  of an actor started from the same weights saved as files, exactly, and no snapshot file exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.datasets import PromptRecord
from mindspeed_rl.models.tiny import TINY_TEST_ARCH, create_tiny_model
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.runtime.records import ScheduledMinibatch

pytestmark = [pytest.mark.integration, pytest.mark.slow]
CONFIGS = Path(__file__).resolve().parents[3] / "configs"
ON_A = {"num_cpus": 0, "resources": {"node_a": 0.01}}
ON_B = {"num_cpus": 0, "resources": {"node_b": 0.01}}
PROMPT = PromptRecord(prompt_id="p0", text="cp:ab=", token_ids=(5, 6, 7), label="ab")


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    nodes = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"node_a": 1}, "object_store_memory": 150 * 2**20},
    )
    nodes.add_node(num_cpus=1, resources={"node_b": 1}, object_store_memory=150 * 2**20)
    import os

    # The stand-in actors below live in this test module: workers must be able to import it.
    here, root = Path(__file__).resolve().parent, Path(__file__).resolve().parents[3]
    path = os.pathsep.join([str(here), str(root), os.environ.get("PYTHONPATH", "")])
    ray.init(address=nodes.address, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield nodes
    ray.shutdown()
    nodes.shutdown()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("two_nodes")
    model = create_tiny_model(root / "model", TINY_TEST_ARCH, seed=0)
    config = load_config_from_files(
        CONFIGS,
        "grpo_tiny_asp",
        (
            f"megatron_training.tokenizer_name_or_path={model}",
            "rl_config.rollout_backend=hf",
            "rl_config.n_samples_per_prompt=2",
            "actor_config.micro_batch_size=16",
            "rl_config.actor_forward_micro_batch_size=32",
            "rl_config.ref_forward_micro_batch_size=32",
            "generate_config.sampling_config.max_tokens=6",
            "generate_config.sampling_config.temperature=0",
        ),
    )
    return {"root": root, "model": model, "rollout": build_run_plan(config).rollout}


class Trainer:
    """The trainer's node: the model's tensors, a stand-in optimizer step, the real exporter."""

    def __init__(self, model: str, transport: str, root: str, channels: tuple[Any, ...] = ()) -> None:
        from safetensors.torch import load_file

        from mindspeed_rl.weights.transports import transport_for

        self.weights = load_file(str(Path(model) / "model.safetensors"))
        self.writer = transport_for(transport).exporter(
            Path(root), 2, run_id="two-nodes", channels=channels, bucket_mb=0.05
        )

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def write_probe(self, folder: str) -> Any:
        from mindspeed_rl.weights.transport import write_probe

        return write_probe(Path(folder))

    def step_and_export(self, version: int) -> tuple[Any, dict[str, torch.Tensor]]:
        from mindspeed_rl.weights.layout import TrainingLayout

        gen = torch.Generator().manual_seed(version)
        for tensor in self.weights.values():
            if tensor.is_floating_point():
                tensor.add_(0.05 * torch.randn(tensor.shape, generator=gen, dtype=tensor.dtype))
        result = self.writer.export(version, self.weights.items(), TrainingLayout()).result(timeout=120)
        return result.handle, {k: v.clone() for k, v in self.weights.items()}


class GuEnd:
    """The generation node's end of the weight flow (what the GenerationUnit runs)."""

    def __init__(self, transport: str, cache_dir: str) -> None:
        from mindspeed_rl.weights.transports import transport_for

        self.weights = transport_for(transport).gu_end(Path(cache_dir))

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def open_channel(self, world: int) -> Any:
        return self.weights.open_channel(0, world, "gloo")

    def convert(self, version: int, path: str, handle: Any) -> Any:
        done = self.weights.convert(version, path, handle)
        assert done.path is not None
        return done.path, self.weights.reload_handle(done.path)


def _actor(rollout: Any, model: str) -> Any:
    import ray

    from mindspeed_rl.workers.generation_actor import GenerationActor

    return (
        ray.remote(GenerationActor)
        .options(**ON_B)
        .remote(rollout, model, {"p0": PROMPT}, gu_id=0, actor_id=0)
    )


def _log_probs(actor: Any) -> tuple[tuple[int, ...], tuple[float, ...]]:
    import ray

    mb = ScheduledMinibatch(
        minibatch_id=0, prompt_ids=("p0",), batch_group_id=0, predicted_load=1.0, order_index=0
    )
    sample = ray.get(actor.generate_minibatch.remote(mb)).samples[0]
    return sample.response_token_ids, sample.rollout_log_probs


def _saved(weights: dict[str, torch.Tensor], model: Path, target: Path) -> str:
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(model, target)
    save_file(weights, str(target / "model.safetensors"))
    return str(target)


def test_shared_fs_is_refused_where_the_snapshot_folder_is_not_shared(cluster, setup) -> None:
    import ray

    from mindspeed_rl.weights.transport import SharedPathError
    from mindspeed_rl.workers.generation_unit import GenerationUnit, GuSpec

    root: Path = setup["root"]
    trainer = (
        ray.remote(Trainer)
        .options(**ON_A)
        .remote(str(setup["model"]), "shared_fs", str(root / "a" / "trainer"))
    )
    probe = ray.get(trainer.write_probe.remote(str(root / "a")))
    for transport in ("shared_fs", "object_store"):
        spec = GuSpec(
            gu_id=0, rollout=setup["rollout"], policy_path=str(setup["model"]), prompts={}, num_actors=1,
            actor_options={}, actor_num_cpus=0.1, cache_dir=str(root / "b" / "gu0"), seed=0,
            weight_transport=transport,
        )  # fmt: skip
        gu = ray.remote(GenerationUnit).options(**ON_B).remote(spec, None)
        if transport == "shared_fs":
            with pytest.raises(ray.exceptions.RayTaskError) as err:
                ray.get(gu.check_probe.remote(probe))
            assert isinstance(err.value.cause, SharedPathError)
            message = str(err.value.cause)
            assert "weight_transport=shared_fs" in message and "node" in message and "object_store" in message
        else:
            assert "probe not seen" in ray.get(gu.check_probe.remote(probe))
        ray.kill(gu)
    ray.kill(trainer)


@pytest.mark.parametrize("transport", ["object_store", "collective"])
def test_refreshes_reach_the_other_node_without_files(cluster, setup, transport: str, tmp_path: Path) -> None:
    import ray

    from mindspeed_rl.weights.transport import memory_path

    gu = ray.remote(GuEnd).options(max_concurrency=4, **ON_B).remote(transport, str(tmp_path / "b" / "gu0"))
    channels = (ray.get(gu.open_channel.remote(2)),) if transport == "collective" else ()
    trainer = (
        ray.remote(Trainer)
        .options(**ON_A)
        .remote(str(setup["model"]), transport, str(tmp_path / "a" / "trainer"), channels)
    )
    actor = _actor(setup["rollout"], str(setup["model"]))
    assert ray.get(trainer.node.remote()) != ray.get(gu.node.remote()), "trainer and GU share a node"
    before = _log_probs(actor)
    for version in (1, 2):  # two refreshes
        handle, weights = ray.get(trainer.step_and_export.remote(version))
        path, memory = ray.get(gu.convert.remote(version, memory_path(version), handle))
        result = ray.get(actor.reload.remote(path, version, memory))
        assert result.status == "loaded" and result.version == version, result
        reference = _actor(setup["rollout"], _saved(weights, setup["model"], tmp_path / f"ref-v{version}"))
        assert _log_probs(actor) == _log_probs(reference), (
            f"v{version}: log-probs differ from the files' engine"
        )
        ray.kill(reference)
    assert _log_probs(actor) != before, "the refreshes changed the weights"
    assert not any(p.is_file() for p in tmp_path.rglob("*") if "ref-v" not in str(p)), (
        "a snapshot file was written"
    )
    for handle_ in (trainer, gu, actor):
        ray.kill(handle_)
