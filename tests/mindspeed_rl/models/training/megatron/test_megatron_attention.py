"""The attention backend per device kind and installed packages (issue #39, defect 3).

The table is the rule of attention.py; the integration cases build megatron's real
TransformerConfig and check the member that reaches it, and replay megatron's own
``_set_attention_backend`` (the GPTModel's constructor step that turns the member into TE's
``NVTE_*`` switches) so the test sees the switches TransformerEngine would read.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import Any

import pytest

from mindspeed_rl.models.training.megatron import attention
from mindspeed_rl.models.training.megatron.attention import attention_choice, installed_flash_attention
from mindspeed_rl.models.training.megatron.layout import DeviceKind, MegatronLayout, SpecKind

FA = ("flash-attn 2.8.3",)

# (device, spec, use_flash_attn, installed flash attention) -> (AttnBackend member, substituted),
# or the refusal's fragment.
TABLE: list[tuple[DeviceKind, SpecKind, bool, tuple[str, ...], tuple[str, bool] | str]] = [
    ("cuda", "transformer_engine", True, FA, ("flash", False)),
    # The defect: TE without flash-attn. `flash` would switch fused and unfused off and leave TE
    # with no kernel at the first forward; `auto` runs cuDNN's fused attention instead, and says so.
    ("cuda", "transformer_engine", True, (), ("auto", True)),
    ("cuda", "transformer_engine", False, FA, ("auto", False)),
    ("cuda", "transformer_engine", False, (), ("auto", False)),
    ("cuda", "local", False, FA, ("local", False)),
    ("cuda", "local", True, FA, "CUDA without TransformerEngine"),
    ("npu", "local", True, (), ("local", False)),
    ("npu", "local", False, (), ("local", False)),
    ("cpu", "local", False, FA, ("local", False)),
    ("cpu", "local", True, FA, "no kernel on CPU"),
]


@pytest.mark.parametrize(("device", "spec", "flash", "installed", "expected"), TABLE)
def test_attention_backend_table(
    device: DeviceKind,
    spec: SpecKind,
    flash: bool,
    installed: tuple[str, ...],
    expected: tuple[str, bool] | str,
) -> None:
    if isinstance(expected, str):
        with pytest.raises(ValueError, match="actor_config.use_flash_attn") as err:
            attention_choice(device, spec, use_flash_attn=flash, flash_attention=installed)
        assert expected in str(err.value)
        return
    choice = attention_choice(device, spec, use_flash_attn=flash, flash_attention=installed)
    assert (choice.backend, choice.substituted) == expected
    if choice.substituted:
        assert "flash-attn is not installed" in choice.kernel and "FusedAttention" in choice.kernel
    if device == "npu" and flash:
        assert "npu_fusion_attention" in choice.kernel


def _fake_distributions(monkeypatch: pytest.MonkeyPatch, versions: dict[str, str]) -> None:
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name in ("flash-attn", "flash-attn-3", "flash-attn-4"):
            if name in versions:
                return versions[name]
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(attention.importlib.metadata, "version", version)


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        ({}, ()),
        ({"flash-attn": "2.8.3"}, ("flash-attn 2.8.3",)),
        # TE 2.20.2 refuses flash-attn >= 2.8.4 and < 2.7.3 on Blackwell: not counted.
        ({"flash-attn": "2.8.4"}, ()),
        ({"flash-attn": "2.6.3"}, ()),
        ({"flash-attn-3": "3.0.0b1"}, ("flash-attn-3 3.0.0b1",)),
    ],
)
def test_installed_flash_attention_reads_the_distributions_te_reads(
    monkeypatch: pytest.MonkeyPatch, versions: dict[str, str], expected: tuple[str, ...]
) -> None:
    _fake_distributions(monkeypatch, versions)
    assert installed_flash_attention() == expected


needs_megatron = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
    reason="megatron-core not installed (make setup installs it)",
)


def _nvte_switches(config: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """What megatron's GPTModel constructor exports for TE: its own ``_set_attention_backend``
    (LanguageModule, megatron-core 0.19.2 and 0.12.1), run on a bare object with our config."""
    from megatron.core.models.common.language_module.language_module import LanguageModule

    names = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")
    for name in names:
        # setenv first so the undo removes what megatron exports here: delenv of an absent variable
        # records nothing, and the switches would leak into every later spawned rank, whose own
        # GPTModel then asserts they match its backend.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    holder = LanguageModule.__new__(LanguageModule)
    object.__setattr__(holder, "config", config)
    LanguageModule._set_attention_backend(holder)
    return {name: os.environ[name] for name in names}


@pytest.mark.integration
@needs_megatron
@pytest.mark.parametrize(
    ("fa", "expected"),
    [
        # TE's three switches (flash, fused, unfused): at least one must stay on for a kernel.
        ({}, ("auto", {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "1"})),
        ({"flash-attn": "2.8.3"}, ("flash", {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"})),
    ],
)  # fmt: skip
def test_cuda_te_flash_request_reaches_megatron_as_a_backend_te_can_run(
    monkeypatch: pytest.MonkeyPatch, fa: dict[str, str], expected: tuple[str, dict[str, str]]
) -> None:
    from mindspeed_rl.models.training.megatron import model as model_module
    from tests.mindspeed_rl.models.training.megatron.test_megatron_specs import (
        DENSE,
        _fake_transformer_engine,
    )

    _fake_transformer_engine(monkeypatch, True)
    _fake_distributions(monkeypatch, fa)
    layout = MegatronLayout(use_flash_attn=True)
    config = model_module.transformer_config(DENSE, layout, param_dtype="float32", device_kind="cuda")
    backend, switches = expected
    assert config.attention_backend.name == backend
    assert _nvte_switches(config, monkeypatch) == switches


@pytest.mark.integration
@needs_megatron
@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_local_spec_devices_switch_te_off(device: DeviceKind, monkeypatch: pytest.MonkeyPatch) -> None:
    from mindspeed_rl.models.training.megatron import model as model_module
    from tests.mindspeed_rl.models.training.megatron.test_megatron_specs import DENSE

    config = model_module.transformer_config(
        DENSE, MegatronLayout(), param_dtype="float32", device_kind=device
    )
    assert config.attention_backend.name == "local"
    assert set(_nvte_switches(config, monkeypatch).values()) == {"0"}
