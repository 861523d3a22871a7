"""Weight flow of the asynchronous pipeline: export → convert → deferred reload.

Modules (import them directly; this package file stays import-light):

- ``layout``   TrainingLayout / InferenceLayout / PartitionSpec rule tables (no torch)
- ``manifest`` SnapshotManifest JSON schema, SnapshotInfo, SnapshotError (no torch)
- ``store``    atomic publish, latest_published, leases, per-run retention, run_root, links (no torch)
- ``shardio``  write one safetensors shard (CRC while writing, or planned and filled tensor by
               tensor); read it back verified (parallel), or verify it streaming (nothing kept)
- ``hostcopy`` host-memory copies outside torch's thread pool (export copy, TP merge)
- ``export``   SnapshotWriter: per-rank export, one in flight + one queued (newer supersedes)
- ``merge``    unfuse / rename / plan + merge TP+EP / split for inference ranks
- ``convert``  GuConverter: once-per-GU conversion into a converted cache (hard link if identity,
               else streamed group by group: host memory of the largest tensor, not the model)
- ``reload``   ReloadPolicy: deferred, validated reload of a generation actor
- ``slots``    an update's shapes against the engine's model folder, errors naming config keys
"""
