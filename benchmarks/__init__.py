"""Benchmarks and verification harnesses (not part of the installed package)."""
