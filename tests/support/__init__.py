"""Helpers shared by several test packages (not tests themselves)."""
