from __future__ import annotations

import os
import socket
import threading
from types import SimpleNamespace

import pytest
import redis

from feature_store import resp


def test_read_through_grows_its_buffer_and_stops_at_the_end_marker() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        _, end = resp.end_marker()
        sent = os.urandom(300_000) + end
        threading.Thread(target=theirs.sendall, args=(sent,)).start()
        small = bytearray(10)
        viewed = memoryview(small)  # a buffer a caller still views is read from, never resized
        got, n = resp.read_through(SimpleNamespace(_sock=ours), end, small)
        assert got[:n] == sent and len(small) == 10 and viewed.nbytes == 10
        # a buffer large enough is filled from its start and handed back as it is
        threading.Thread(target=theirs.sendall, args=(sent,)).start()
        again, n = resp.read_through(SimpleNamespace(_sock=ours), end, got)
        assert again is got and got[:n] == sent


def test_a_connection_closed_before_the_end_marker_is_a_connection_error() -> None:
    ours, theirs = socket.socketpair()
    with ours:
        theirs.sendall(b"$3\r\nabc\r\n")
        theirs.close()
        with pytest.raises(redis.ConnectionError, match="closed the connection"):
            resp.read_through(SimpleNamespace(_sock=ours), resp.end_marker()[1], bytearray(4))


def test_rows_of_another_layout_are_not_cut() -> None:
    layout = resp.RowLayout.of((8, 16))
    row = b"*2\r\n$8\r\n" + bytes(8) + b"\r\n$16\r\n" + bytes(16) + b"\r\n"
    assert resp.fixed_rows(row * 3, 3, layout).shape == (3, len(row))
    assert resp.fixed_rows(row * 3, 3, layout, offset=1) is None
    longer = row.replace(b"$16\r\n" + bytes(16), b"$17\r\n" + bytes(17))
    assert resp.fixed_rows(row + longer + row, 3, layout) is None
    assert resp.fixed_rows(row * 2, 3, layout) is None
