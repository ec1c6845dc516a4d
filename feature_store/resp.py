"""RESP on the wire for the store's pipelines: commands pre-encoded as bytes, replies read off the socket.

A read of many entities sends one HMGET of the same fields per entity. When every value is there, each
reply is the same bytes around values of the same lengths (`*2\\r\\n$8\\r\\n<8 bytes>\\r\\n$1440\\r\\n...`),
so the replies of a batch are a matrix of fixed-length rows: checked against that layout and cut into
columns in numpy (`fixed_rows`), with no object per reply. hiredis builds a bytes object per value
and, fed a large reply at once, moves the unread rest of its buffer after every reply it hands out
(measured: 340 µs to parse the 290 kB of 100 entities' rings, as long as Redis took to send them).
A batch with a value missing, of another length or an error is parsed by hiredis (`parse`).

Where a batch ends is marked by an ECHO of a random 16-byte nonce sent after its commands: the bytes
read end with its reply (`read_through`), whatever the replies before it hold, with nothing parsed.

>>> layout = RowLayout.of((8, 3))
>>> raw = b"*2\\r\\n$8\\r\\n" + bytes(range(8)) + b"\\r\\n$3\\r\\nabc\\r\\n"
>>> rows = fixed_rows(raw * 2, 2, layout)
>>> rows.shape, bytes(rows[1, layout.value_at[1]:layout.value_at[1] + 3])
((2, 27), b'abc')
>>> fixed_rows(b"*2\\r\\n$-1\\r\\n$3\\r\\nabc\\r\\n" * 2, 2, layout) is None
True
>>> parse(raw + b"$-1\\r\\n", 2)
[[b'\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07', b'abc'], None]
>>> parse(raw[:-3], 1)
Traceback (most recent call last):
...
redis.exceptions.ConnectionError: Redis sent 0 of 1 replies before the end marker
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import hiredis
import numpy as np
import redis

FEED_BYTES = 1 << 16  # hiredis moves its unread buffer after each reply: fed a little at a time
# a receive asks for at most this much: 1,000 entities' 2.9 MB of replies came in 3.0 ms in 64 KB
# receives and 4.1 ms in receives of the whole rest of the buffer (README, "Reads")
RECEIVE_BYTES = 1 << 16
NONCE_BYTES = 16


def bulk_strings(parts: Sequence[bytes]) -> bytes:
    return b"".join([b"$%d\r\n%s\r\n" % (len(p), p) for p in parts])


def end_marker() -> tuple[bytes, bytes]:
    """A command marking the end of a pipeline (ECHO of a random nonce) and the reply that ends its bytes."""
    nonce = os.urandom(NONCE_BYTES)
    return b"*2\r\n$4\r\nECHO\r\n" + bulk_strings([nonce]), bulk_strings([nonce])


@dataclass(frozen=True)
class RowLayout:
    """One array reply of bulk strings of fixed lengths: its bytes with the values zeroed (`template`),
    the positions of the bytes that are not values (`fixed`) and the offset of each value (`value_at`)."""

    template: np.ndarray
    fixed: np.ndarray
    value_at: tuple[int, ...]

    @classmethod
    def of(cls, sizes: Sequence[int]) -> RowLayout:
        template, value_at = bytearray(b"*%d\r\n" % len(sizes)), []
        for size in sizes:
            template += b"$%d\r\n" % size
            value_at.append(len(template))
            template += bytes(size) + b"\r\n"
        is_value = np.zeros(len(template), dtype=bool)
        for at, size in zip(value_at, sizes, strict=True):
            is_value[at:at + size] = True
        return cls(np.frombuffer(bytes(template), dtype=np.uint8), np.flatnonzero(~is_value), tuple(value_at))

    @property
    def width(self) -> int:
        return len(self.template)


def fixed_rows(raw: bytes | bytearray | memoryview, n: int, layout: RowLayout, offset: int = 0) -> np.ndarray | None:
    """The `n` replies of `raw` from byte `offset` as rows [n, layout.width] of bytes when every one has
    the layout (checked byte for byte outside the values, which is the parse), else None."""
    if len(raw) < offset + n * layout.width:
        return None
    rows = np.frombuffer(raw, dtype=np.uint8, count=n * layout.width, offset=offset).reshape(n, layout.width)
    if not (rows[:, layout.fixed] == layout.template[layout.fixed]).all():
        return None
    return rows


def leading_reply(raw: bytes | bytearray | memoryview) -> tuple[list[bytes | None], int] | None:
    """The first reply in `raw` and how many bytes it takes, when it is a short array of bulk strings
    (an HMGET's); else None.

    >>> leading_reply(b"*2\\r\\n$-1\\r\\n$2\\r\\nab\\r\\n+OK\\r\\n"), leading_reply(b"-ERR no\\r\\n")
    (([None, b'ab'], 17), None)
    """
    reader = hiredis.Reader()
    reader.feed(memoryview(raw)[:FEED_BYTES])
    reply = reader.gets()
    if not isinstance(reply, list) or not all(v is None or isinstance(v, bytes) for v in reply):
        return None
    return reply, len(b"*%d\r\n" % len(reply)) + sum(5 if v is None else len(b"$%d\r\n" % len(v)) + len(v) + 2
                                                    for v in reply)


def parse(raw: bytes | bytearray | memoryview, n: int) -> list[Any]:
    """The `n` replies in `raw`, an error reply as an exception object."""
    reader = hiredis.Reader()
    replies: list[Any] = []
    view = memoryview(raw)
    for start in range(0, len(raw), FEED_BYTES):
        reader.feed(view[start:start + FEED_BYTES])
        _take(reader, replies, n)
    if len(replies) < n:
        raise redis.ConnectionError(f"Redis sent {len(replies)} of {n} replies before the end marker")
    return replies


def read_through(connection: redis.Connection, end: bytes, into: bytearray) -> tuple[bytearray, int] | None:
    """The bytes from the connection up to and including `end` (the reply of `end_marker`'s command),
    received straight into `into` from its start; when it is full, into a new buffer twice as large (one
    a caller may still view is never resized). Returns the buffer holding them and their number, or None
    for a redis-py without the private socket (then `each_reply` reads its replies)."""
    sock = getattr(connection, "_sock", None)
    if sock is None:
        return None
    got, n = into, 0
    free = memoryview(got)
    try:
        while n < len(end) or got[n - len(end):n] != end:
            if n == len(got):
                free.release()
                grown = bytearray(max(2 * n, FEED_BYTES))
                grown[:n] = got
                got, free = grown, memoryview(grown)
            n += _received(sock.recv_into, free[n:n + RECEIVE_BYTES])
    finally:
        free.release()
    return got, n


def each_reply(connection: redis.Connection, n: int) -> list[Any]:
    """The next `n` replies, an error reply as an exception object. Parsed straight off the socket by
    hiredis: redis-py's per-reply read_response costs about as much as Redis takes to answer."""
    sock = getattr(connection, "_sock", None)
    replies: list[Any] = []
    if sock is None:  # a redis-py without the private socket: its own parser, slower, same replies
        for _ in range(n):
            try:
                replies.append(connection.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
        return replies
    reader = hiredis.Reader()
    while len(replies) < n:
        reader.feed(_received(sock.recv, FEED_BYTES))
        _take(reader, replies, n)
    return replies


def _take(reader: hiredis.Reader, replies: list[Any], n: int) -> None:
    """The replies the reader holds complete onto `replies`, up to `n` in all."""
    while len(replies) < n and (reply := reader.gets()) is not False:
        replies.append(reply)


def _received(receive: Any, into: Any) -> Any:
    """`receive(into)` (a socket's recv or recv_into), its errors as redis-py's, an end of stream as one."""
    try:
        got = receive(into)
    except TimeoutError as exc:  # as redis-py's own reads: a retryable error, not an OSError
        raise redis.TimeoutError(f"reading from Redis: {exc}") from exc
    except OSError as exc:
        raise redis.ConnectionError(f"reading from Redis: {exc}") from exc
    if not got:
        raise redis.ConnectionError("Redis closed the connection during a read")
    return got
