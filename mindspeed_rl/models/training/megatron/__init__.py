"""The Megatron-core training backend (TP/PP/EP/DP GPTModel trained with the GRPO loss).

Nothing in this package imports megatron at module import time: ``patches.import_megatron`` does
it on first use (after ``mindspeed.megatron_adaptor`` on Ascend), so the project imports and its
config mapper runs on machines without megatron-core.
"""
