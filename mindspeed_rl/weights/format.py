"""The snapshot format version: the one contract between the Training Unit's Python environment
and the Generation Units' (``async_config.role_envs``).

Whatever carries the weights, what crosses from the trainer's process to a Generation Unit's is
data in this project's own format, never a pickled torch, vLLM or megatron object:

    shared_fs     manifest.json (``manifest.SnapshotManifest``, JSON) + safetensors shards
    object_store  ``memory_snapshot.MemorySnapshot``: plain records + numpy byte buffers
    collective    ``collective.Header`` (JSON) + raw byte buckets

So the two sides may run different torch, transformers or numpy versions, but they must agree
on this number: bump it whenever any of the three changes in a way an older reader would
misread. ``manifest.SCHEMA_VERSION`` is this number (the manifest records it and a reader
refuses another one); an async run with role environments compares it across both environments
before any model loads (``utils.role_env_check``).

No imports: every environment, however light, reads it.
"""

SNAPSHOT_FORMAT_VERSION = 1
