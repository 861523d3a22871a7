"""Megatron engine parity harnesses (CPU, gloo): engine cases, resume cases, reload cases, and the
random tiny checkpoints they and the megatron tests build (models.py).

Driven by ``benchmarks/megatron_parity.py`` and by the gloo tests; a training run never imports
them, so they live outside the package.
"""
