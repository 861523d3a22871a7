"""The run plan: the one reader of the typed config (``build``), its sections and its placement."""
