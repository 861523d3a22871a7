"""The wire form of a ``DeltaRefresh`` (``weights/delta.py``): one byte buffer any transport
carries (a file, an object, a collective's bucket), safetensors of the raw words and indices with
the record's fields in its metadata. Its own module because only the media need it; the codec
does not."""

from __future__ import annotations

import json

import numpy as np

from mindspeed_rl.weights.delta import ChecksumAlgo, DeltaRefresh, TensorDelta

_WIRE_DEFAULT_ALGO: ChecksumAlgo = "crc32"
"""A wire form without ``checksum_algo`` was packed when crc32 was the only checksum."""


def pack(refresh: DeltaRefresh) -> bytes:
    """One byte buffer any transport can carry (a file, an object, a collective's bucket):
    safetensors of the raw words and indices, the record's fields in its metadata."""
    from safetensors.numpy import save

    arrays: dict[str, np.ndarray] = {}
    header = []
    for i, part in enumerate(refresh.tensors):
        arrays[f"{i}.data"] = part.data
        if part.indices is not None and part.blocks is not None:
            arrays[f"{i}.indices"] = part.indices
            arrays[f"{i}.blocks"] = part.blocks
        header.append([part.name, part.dtype, list(part.shape), part.encoding, part.checksum])
    meta = {
        "version": refresh.version,
        "base_version": refresh.base_version,
        "tensors": header,
        "full_nbytes": refresh.full_nbytes,
        "changed_elements": refresh.changed_elements,
        "total_elements": refresh.total_elements,
        "encode_seconds": refresh.encode_seconds,
        "checksum_algo": refresh.checksum_algo,
    }
    return save(arrays, metadata={"delta": json.dumps(meta)})


def unpack(buffer: bytes) -> DeltaRefresh:
    from safetensors.numpy import load

    arrays = load(buffer)
    # safetensors' loaders return no metadata from bytes: read it from the header (8-byte length + JSON).
    size = int.from_bytes(buffer[:8], "little")
    meta = json.loads(json.loads(buffer[8 : 8 + size])["__metadata__"]["delta"])
    parts = tuple(
        TensorDelta(
            name=name,
            dtype=dtype,
            shape=tuple(shape),
            encoding=encoding,
            checksum=int(checksum),
            data=arrays[f"{i}.data"],
            indices=arrays.get(f"{i}.indices"),
            blocks=arrays.get(f"{i}.blocks"),
        )
        for i, (name, dtype, shape, encoding, checksum) in enumerate(meta["tensors"])
    )
    return DeltaRefresh(
        version=int(meta["version"]),
        base_version=meta["base_version"],
        tensors=parts,
        full_nbytes=int(meta["full_nbytes"]),
        changed_elements=int(meta["changed_elements"]),
        total_elements=int(meta["total_elements"]),
        encode_seconds=float(meta["encode_seconds"]),
        checksum_algo=_wire_algo(meta.get("checksum_algo", _WIRE_DEFAULT_ALGO)),
    )


def _wire_algo(name: object) -> ChecksumAlgo:
    if name == "xxh3_64" or name == "crc32":
        return name
    # A sender this receiver does not understand: unreadable, as a torn file is (a full follows).
    raise ValueError(f"a weight delta checksummed with {name!r}; this receiver knows xxh3_64 and crc32")
