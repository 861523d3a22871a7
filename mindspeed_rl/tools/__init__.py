"""Tools for multi-turn (agentic) rollouts: call parsers, the tool protocol, the code sandbox,
tool-config loading and the engine-independent agent loop.

Nothing here imports torch or an engine, so a generation actor, the config checker and unit tests
all load it cheaply.
"""
