"""Errors raised by the runtime."""

from __future__ import annotations


class ProtocolError(ValueError):
    """A caller broke the control protocol (e.g. completed a minibatch it was never allowed to
    start). This is a bug in an adapter (Ray worker, simulator), reported with the call that
    broke the rule and how to follow it."""
