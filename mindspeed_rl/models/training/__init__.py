"""Training engines behind the :class:`~mindspeed_rl.models.training.base.TrainingEngine` Protocol.

Import the concrete modules (``torch_engine``, ``reference``, ``sft_warmup``) directly; this package
init stays import-light.
"""
