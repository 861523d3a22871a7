"""Which attention kernel the megatron engine asks for, per device kind and installed packages.

Pure (no torch, no megatron imports): the choice is a name of megatron's ``AttnBackend`` member
plus a sentence saying what will run, so it can be tested as a table and printed before any
heavy work.

What the choice drives, read in megatron-core 0.19.2 and 0.12.1
(``models/common/language_module/language_module.py``, ``_set_attention_backend``): the
GPTModel turns ``config.attention_backend`` into TransformerEngine's opt-out variables
``NVTE_FLASH_ATTN`` / ``NVTE_FUSED_ATTN`` / ``NVTE_UNFUSED_ATTN``; ``flash`` sets them to 1/0/0,
``auto`` to 1/1/1, ``local`` to 0/0/0 (the local spec's megatron attention reads none of them).
TransformerEngine 2.20.2 (``pytorch/attention/dot_product_attention/backends.py`` and
``utils.py``) counts flash attention as present only when the ``flash-attn`` distribution
(2.1.1 <= version < 2.8.4; >= 2.7.3 on Blackwell), ``flash-attn-3`` or ``flash-attn-4`` is
installed, and raises "No dot product attention backend is available" at the first forward when
all three backends end up off: ``flash`` without such a package is exactly that. No stack of ours
installs flash-attn (PyPI has only its sdist, a CUDA build of an hour), so on CUDA the flash
request is served by ``auto``: TE then runs its FusedAttention (cuDNN's fused flash-style
kernel) and falls back to its unfused attention where cuDNN does not support the shape.

On NPU the spec is the local one and MindSpeed (26.1.0_core_r0.12.1) replaces
``DotProductAttention.forward`` by ``torch_npu.npu_fusion_attention`` when its own
``--use-flash-attn`` argument is set (:func:`..patches.mindspeed_argv` passes it); it never reads
``attention_backend``, so the engine asks megatron for ``local`` there, as on CPU.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Literal

from packaging.version import InvalidVersion, Version

from mindspeed_rl.models.training.megatron.layout import DeviceKind, SpecKind, flash_attention_refusal

BackendName = Literal["flash", "auto", "local"]
"""Members of ``megatron.core.transformer.enums.AttnBackend`` the engine uses."""

# TE 2.20.2 accepts flash-attn 2 in [2.1.1, 2.8.4) before Blackwell and [2.7.3, 2.8.4) on it; the
# engine asks for `flash` only with a version TE accepts on every GPU it supports.
_FA2_RANGE = (Version("2.7.3"), Version("2.8.4"))
_FA_NEWER = ("flash-attn-3", "flash-attn-4")


def installed_flash_attention() -> tuple[str, ...]:
    """The flash-attention distributions of this process that TransformerEngine would use, as
    ``"name version"`` (read from the installed metadata, nothing imported)."""
    found = []
    for dist in ("flash-attn", *_FA_NEWER):
        try:
            raw = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        if dist == "flash-attn":
            try:
                version = Version(raw)
            except InvalidVersion:
                continue
            if not _FA2_RANGE[0] <= version < _FA2_RANGE[1]:
                continue
        found.append(f"{dist} {raw}")
    return tuple(found)


@dataclass(frozen=True, slots=True)
class AttentionChoice:
    """The ``AttnBackend`` member to configure and what actually runs."""

    backend: BackendName
    kernel: str
    substituted: bool = False
    """True when ``use_flash_attn: true`` is served by another kernel than the one asked for."""


def attention_choice(
    device_kind: DeviceKind,
    spec: SpecKind,
    *,
    use_flash_attn: bool,
    flash_attention: tuple[str, ...] | None = None,
) -> AttentionChoice:
    """The attention backend for ``device_kind`` with layer ``spec``.

    ``flash_attention``: the flash-attention distributions on the training host
    (:func:`installed_flash_attention` of this process when None). Raises ValueError, naming the
    key, where ``use_flash_attn: true`` has no kernel (CPU, CUDA without TransformerEngine);
    :func:`..layout.check_trainable` refuses the same layouts with the same message.
    """
    if device_kind == "npu":
        if use_flash_attn:
            return AttentionChoice("local", "MindSpeed's npu_fusion_attention (--use-flash-attn)")
        return AttentionChoice("local", "megatron's local (unfused) attention")
    if device_kind == "cuda" and spec == "transformer_engine":
        fa = installed_flash_attention() if flash_attention is None else flash_attention
        if not use_flash_attn:
            return AttentionChoice("auto", "TransformerEngine's choice among flash, fused and unfused")
        if fa:
            return AttentionChoice("flash", f"TransformerEngine's flash attention ({', '.join(fa)})")
        return AttentionChoice(
            "auto",
            "TransformerEngine's FusedAttention (cuDNN) for use_flash_attn: flash-attn is not "
            "installed (TE's flash backend would leave no kernel); TE falls back to its unfused "
            "attention where cuDNN does not support the shape",
            substituted=True,
        )
    if use_flash_attn:
        where = "CPU" if device_kind == "cpu" else "CUDA without TransformerEngine"
        raise ValueError(flash_attention_refusal(where))
    return AttentionChoice("local", "megatron's local (unfused) attention")
