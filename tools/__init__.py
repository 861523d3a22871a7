"""Repository tools (not part of the package): the stack resolver check."""
