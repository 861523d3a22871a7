"""The one adapter between this project and the transformers versions its environments hold.

Each role may run its own environment (``async_config.role_envs``), and the sets differ: the Ascend
trainer set keeps transformers 4.x (MindSpeed's torch 2.7.1 line; upstream MindSpeed-RL pins
4.57.1), vllm-ascend 0.23 pins 5.5.4, the CPU and GPU sets 5.19. Where this project touches an API
that differs between them, the difference lives here, chosen by the installed major version (the
recorded facts below, read in each release's source; ``tests/.../test_transformers_compat.py``
checks them against the installed classes, and under ``make test-trainer-stack`` against 4.57.1):

    what                    4.x (read: 4.57.1)                           5.x (read: installed 5.19.0)
    tied parameters         class patterns ``_tied_weights_keys`` over   ``model.all_tied_weights_keys``
                            tensors that share storage (save_pretrained  {tied name: source name}
                            drops the matching names, modeling_utils
                            .py:4030-4056)
    RoPE base in a config   ``rope_theta=`` (+ ``rope_scaling``),         ``rope_parameters={"rope_type",
                            configuration_qwen3.py:170-207              "rope_theta"}``; writes no rope_theta
    a fast tokenizer's      ``"tokenizer_class": "PreTrainedTokenizer    ``"TokenizersBackend"``, and
    tokenizer_config.json   Fast"``, ``additional_special_tokens``      ``extra_special_tokens`` a list
                            list; ``extra_special_tokens`` must be a    (4.x: "Tokenizer class Tokenizers
                            dict (tokenization_utils_base.py:1209)      Backend does not exist", then
                                                                        AttributeError on the list)

Both read configs of the other major: 5.x converts a legacy top-level ``rope_theta``; 4.x does not
know ``rope_parameters`` and silently takes its default base (10000 for Qwen3) unless
``load_config`` moves it over. So a config this project writes carries both spellings
(``write_portable_config``), and one it reads goes through ``load_config``; likewise a tokenizer
folder (``write_portable_tokenizer``: the 4.x spelling, which 5.x reads as the same tokenizer,
measured: same ids, special tokens and chat template; ``load_tokenizer``).
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

RECORDED_QWEN3_ROPE_PARAMETERS: Mapping[int, tuple[str, ...]] = {
    # Qwen3Config.__init__'s RoPE parameters, by transformers major version.
    4: ("rope_theta", "rope_scaling"),  # 4.57.1 configuration_qwen3.py:170-171
    5: ("rope_parameters",),  # installed 5.19.0
}


def major_version() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def rope_config_kwargs(theta: float) -> dict[str, Any]:
    """The keyword arguments that give a Qwen-family config a plain RoPE of base ``theta``."""
    if major_version() >= 5:
        return {"rope_parameters": {"rope_type": "default", "rope_theta": float(theta)}}
    return {"rope_theta": float(theta)}


def rope_base(config: PretrainedConfig) -> float:
    """The RoPE base a loaded config carries, whichever major read it."""
    if major_version() >= 5:
        return float(config.rope_parameters["rope_theta"])
    return float(config.rope_theta)


def tied_targets(model: PreTrainedModel) -> dict[str, str]:
    """``{tied name: the name it shares storage with}``, e.g. ``{"lm_head.weight":
    "model.embed_tokens.weight"}``; empty for untied models: the names ``save_pretrained`` leaves
    out of the checkpoint."""
    if major_version() >= 5:
        return {str(k): str(v) for k, v in model.all_tied_weights_keys.items()}
    return _tied_by_storage(model)


def _tied_by_storage(model: PreTrainedModel) -> dict[str, str]:
    """4.x: within each group of state-dict tensors sharing storage, the names matching a module's
    ``_tied_weights_keys`` (or ``_dynamic_tied_weights_keys``) patterns are the tied ones, as 4.57.1's
    save_pretrained decides; the first other name of the group is their source."""
    patterns = []
    for prefix, module in model.named_modules():
        for attr in ("_tied_weights_keys", "_dynamic_tied_weights_keys"):
            for key in getattr(module, attr, None) or ():
                patterns.append(f"{prefix}.{key}" if prefix else str(key))
    groups: dict[tuple[Any, ...], list[str]] = defaultdict(list)
    for name, tensor in model.state_dict().items():
        groups[_storage_key(tensor)].append(name)
    out: dict[str, str] = {}
    for names in groups.values():
        if len(names) < 2:
            continue
        ordered = sorted(names)
        tied = [n for n in ordered if any(re.search(p, n) for p in patterns)][: len(names) - 1]
        source = next(n for n in ordered if n not in tied)
        out.update({n: source for n in tied})
    return out


def _storage_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))


def load_config(path: str | os.PathLike[str], **kwargs: Any) -> PretrainedConfig:
    """``AutoConfig.from_pretrained`` that keeps the RoPE base of a config written by the other
    major version (see the module docstring)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(os.fspath(path), **kwargs)
    if major_version() < 5:
        _legacy_rope_from_parameters(config)
    return config


def _legacy_rope_from_parameters(config: PretrainedConfig) -> None:
    """4.x reading a 5.x config: ``rope_parameters`` became a plain attribute and ``rope_theta``
    took the class default; move the recorded base (and a scaling) back."""
    for sub in _text_configs(config):
        params = getattr(sub, "rope_parameters", None)
        if not isinstance(params, Mapping) or "rope_theta" not in params:
            continue
        sub.rope_theta = float(params["rope_theta"])
        if params.get("rope_type", "default") != "default":
            sub.rope_scaling = {k: v for k, v in params.items() if k != "rope_theta"}


def _text_configs(config: PretrainedConfig) -> list[Any]:
    text = getattr(config, "text_config", None)
    return [config] if text is None else [config, text]


def write_portable_config(folder: str | os.PathLike[str]) -> None:
    """Make ``folder/config.json`` readable by both majors: a 5.x config also gets the legacy
    top-level ``rope_theta`` (``rope_scaling`` for a scaled RoPE) that 4.x reads; 5.x reads it as
    the same RoPE. A config already carrying them is left as it is."""
    path = Path(folder) / "config.json"
    data = json.loads(path.read_text())
    changed = False
    for sub in (data, data.get("text_config")):
        if not isinstance(sub, dict):
            continue
        params = sub.get("rope_parameters")
        if not isinstance(params, dict) or "rope_theta" not in params or "rope_theta" in sub:
            continue
        sub["rope_theta"] = params["rope_theta"]
        if params.get("rope_type", "default") != "default" and "rope_scaling" not in sub:
            sub["rope_scaling"] = {k: v for k, v in params.items() if k != "rope_theta"}
        changed = True
    if changed:
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _tokenizer_config(folder: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    path = Path(folder) / "tokenizer_config.json"
    return path, (json.loads(path.read_text()) if path.is_file() else {})


def _is_5x_fast(config: Mapping[str, Any]) -> bool:
    return config.get("tokenizer_class") == "TokenizersBackend" or isinstance(
        config.get("extra_special_tokens"), list
    )


def _portable_tokenizer_fields(config: dict[str, Any]) -> dict[str, Any]:
    out = dict(config)
    if out.get("tokenizer_class") == "TokenizersBackend":
        out["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = out.get("extra_special_tokens")
    if isinstance(extra, list):
        del out["extra_special_tokens"]
        known = list(out.get("additional_special_tokens") or [])
        out["additional_special_tokens"] = known + [t for t in extra if t not in known]
    return out


def write_portable_tokenizer(folder: str | os.PathLike[str]) -> None:
    """Make a fast tokenizer saved by transformers 5.x loadable by 4.x too (its 4.x spelling;
    see the module docstring). A folder in the 4.x spelling already is left as it is."""
    path, config = _tokenizer_config(folder)
    if config and _is_5x_fast(config):
        path.write_text(json.dumps(_portable_tokenizer_fields(config), indent=2, sort_keys=True) + "\n")


# The generic fast-tokenizer class under both spellings (4.x ``PreTrainedTokenizerFast``, 5.x's
# ``TokenizersBackend``, which 5.x also exports under the 4.x name).
_GENERIC_FAST = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})
# The tiny families whose generic tokenizer AutoTokenizer (transformers 5.19) keeps as it is. Not
# qwen2: 5.x overrides that model type's hub class with its registered Qwen2Tokenizer. The test
# compares the class for every tiny family, so a release that changes these rules fails it.
_AUTO_KEEPS_GENERIC = frozenset({"qwen3", "qwen3_moe"})


def _built_here_with_a_generic_fast_tokenizer(folder: str | os.PathLike[str]) -> bool:
    """A model folder ``models/tiny.py`` wrote (its build record beside the weights) of a family
    AutoTokenizer leaves generic, whose tokenizer is the generic fast class, in transformers 5.x: a
    real checkpoint always goes through AutoTokenizer, whose per-model-type rules stay authoritative."""
    from mindspeed_rl.models.training.hf_folder import BUILD_RECORD

    model_config = Path(folder) / "config.json"
    if not (Path(folder) / BUILD_RECORD).is_file() or not model_config.is_file() or major_version() < 5:
        return False
    if json.loads(model_config.read_text()).get("model_type") not in _AUTO_KEEPS_GENERIC:
        return False
    _, config = _tokenizer_config(folder)
    return bool(config) and config.get("tokenizer_class") in _GENERIC_FAST


def load_tokenizer(folder: str | os.PathLike[str]) -> Any:
    """``AutoTokenizer.from_pretrained`` (local files only); under 4.x, a fast tokenizer a 5.x
    environment saved is read as the ``PreTrainedTokenizerFast`` it is. A folder this project built
    (``models/tiny.py``) is read by the class it was saved with, without AutoTokenizer."""
    if _built_here_with_a_generic_fast_tokenizer(folder):
        # Importing AutoTokenizer costs 3.4-3.8 s of CPU in every process that loads a tokenizer
        # (transformers 5.19 builds its whole auto mapping), against 0.8 s for the class alone;
        # the driver, the trainer and each actor load one per run. On a generic fast tokenizer
        # AutoTokenizer resolves to this same class (tests/.../test_transformers_compat.py).
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(os.fspath(folder), local_files_only=True)
    from transformers import AutoTokenizer

    if major_version() < 5:
        _, config = _tokenizer_config(folder)
        if _is_5x_fast(config):
            from transformers import PreTrainedTokenizerFast

            fields = _portable_tokenizer_fields(config)
            return PreTrainedTokenizerFast.from_pretrained(
                os.fspath(folder),
                local_files_only=True,
                extra_special_tokens={},
                additional_special_tokens=fields.get("additional_special_tokens", []),
            )
    return AutoTokenizer.from_pretrained(os.fspath(folder), local_files_only=True)
