"""How every long-running command stops: the first SIGTERM or SIGINT asks it to finish cleanly (the
trainer writes its final snapshot) within a bounded time; a second one, or running out of that time,
exits at once. `docker stop`, systemd and Kubernetes send SIGTERM; Ctrl-C sends SIGINT."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def graceful_stop(timeout_s: float, interrupt: bool = False) -> Iterator[threading.Event]:
    """Inside the block, the first signal sets the returned event (and with `interrupt`, for commands
    built around Ctrl-C, raises KeyboardInterrupt in the main thread too); after `timeout_s` more, or
    at a second signal, the process exits with 128 + the signal number, the cause on stderr's last line."""
    event = threading.Event()
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def expire(signum: int) -> None:
        if not finished.wait(timeout_s):
            _say(f"did not stop within {timeout_s:.0f} s of {signal.Signals(signum).name}; exiting now")
            os._exit(128 + signum)

    def handle(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if event.is_set():
            _say(f"second {name}: exiting now, without finishing")
            os._exit(128 + signum)
        event.set()
        _say(f"{name} received: finishing (at most {timeout_s:.0f} s); send it again to exit at once")
        threading.Thread(target=expire, args=(signum,), name="stop-deadline", daemon=True).start()
        if interrupt:
            raise KeyboardInterrupt

    finished = threading.Event()
    for s in previous:
        signal.signal(s, handle)
    try:
        yield event
    finally:
        finished.set()
        for s, handler in previous.items():
            signal.signal(s, handler)
