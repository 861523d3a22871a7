"""Weight flow of the asynchronous pipeline: export → convert → deferred reload.

Modules (import them directly; this package file stays import-light):

- ``layout``   TrainingLayout / InferenceLayout / PartitionSpec rule tables (no torch)
- ``manifest`` SnapshotManifest JSON schema, SnapshotInfo, SnapshotError (no torch)
- ``store``    atomic publish, latest_published, leases, retention (no torch)
- ``shardio``  write one safetensors shard; read one back verified (parallel loader)
- ``export``   SnapshotWriter: asynchronous per-rank export and publish (training side)
- ``merge``    unfuse / rename / merge TP+EP / split for inference ranks
- ``convert``  GuConverter: once-per-GU conversion into a converted cache
- ``reload``   ReloadPolicy: deferred, validated reload of a generation actor
"""
