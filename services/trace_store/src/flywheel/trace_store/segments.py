"""Segment objects: many spans in one gzip-compressed JSONL object in S3.

Keys are ``segments/<YYYY-MM-DD>/<agent>/<uuid>.jsonl.gz`` (the day of the spans' start
time), so a retention sweep or a bulk export can walk a day and an agent by prefix. The
index row of a span names its segment and line. Erasure rewrites a segment with the
erased lines replaced by ``null``, so the line numbers of the others stay valid.
"""

from __future__ import annotations

import asyncio
import gzip
import uuid
from collections import OrderedDict
from datetime import datetime

import orjson

from flywheel.core.objects import ObjectStore

PURPOSE = "traces"
CONTENT_TYPE = "application/x-ndjson"
ERASED = b"null"


def segment_key(day: datetime, agent: str) -> str:
    return f"segments/{day:%Y-%m-%d}/{agent}/{uuid.uuid4().hex}.jsonl.gz"


# Level 3 compresses the ingest path's JSON to within 15% of level 6 at a third of the CPU.
COMPRESS_LEVEL = 3


def dumps(record: dict[str, object]) -> bytes:
    """One segment line (compact UTF-8 JSON)."""
    return orjson.dumps(record)


def encode(records: list[dict[str, object]]) -> bytes:
    return gzip.compress(b"\n".join(map(orjson.dumps, records)), compresslevel=COMPRESS_LEVEL, mtime=0)


def decode(data: bytes) -> list[dict[str, object] | None]:
    """The lines of a segment; an erased line is None."""
    return [orjson.loads(line) for line in gzip.decompress(data).split(b"\n")]


def encode_lines(lines: list[dict[str, object] | None]) -> bytes:
    data = b"\n".join(ERASED if r is None else orjson.dumps(r) for r in lines)
    return gzip.compress(data, compresslevel=COMPRESS_LEVEL, mtime=0)


class SegmentStore:
    """Reads and writes segments; recently read segments are kept decoded in memory."""

    def __init__(self, objects: ObjectStore, *, cache_size: int = 64) -> None:
        self._objects = objects
        self._cache: OrderedDict[str, list[dict[str, object] | None]] = OrderedDict()
        self._cache_size = cache_size

    async def put(self, key: str, data: bytes) -> None:
        await self._objects.put_bytes(PURPOSE, key, data, content_type=CONTENT_TYPE)

    async def read(self, key: str) -> list[dict[str, object] | None]:
        lines = self._cache.get(key)
        if lines is None:
            lines = decode(await self._objects.get_bytes(PURPOSE, key))
            self._cache[key] = lines
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return lines

    async def erase_lines(self, key: str, lines_to_erase: set[int]) -> None:
        """Rewrite a segment without the given lines (they become ``null``)."""
        self._cache.pop(key, None)
        lines = decode(await self._objects.get_bytes(PURPOSE, key))
        await self.put(key, encode_lines([None if i in lines_to_erase else r for i, r in enumerate(lines)]))

    async def delete(self, key: str) -> None:
        self._cache.pop(key, None)
        client, bucket = self._objects.client, self._objects.bucket(PURPOSE)
        await asyncio.to_thread(client.remove_object, bucket, key)

    async def keys(self, prefix: str = "segments/") -> list[str]:
        return await self._objects.list_keys(PURPOSE, prefix)

    async def keys_older_than(self, cutoff: datetime, prefix: str = "segments/") -> list[str]:
        """Segment keys last written before ``cutoff``."""
        client, bucket = self._objects.client, self._objects.bucket(PURPOSE)

        def _list() -> list[str]:
            objs = client.list_objects(bucket, prefix=prefix, recursive=True)
            return [o.object_name for o in objs if o.object_name and o.last_modified and o.last_modified < cutoff]

        return await asyncio.to_thread(_list)
