"""Signals noted by their handler and acted on where the process chooses: the one way slurmkit's
worker loops (the job's supervisor, a command run's echo) take a signal while they wait in select.

A handler that acts (forwards, raises) can fire between any two bytecodes; one that only notes the
signal cannot lose or half-do the work around it. The wakeup fd ends the select at once."""

from __future__ import annotations

import os
import signal
from typing import Any, Self


class SignalInbox:
    """Once installed: each of `signums` is only noted, and `fd` becomes readable when one comes.
    `take()` returns those noted since, in order. Used as a context manager, the handlers and wakeup
    fd before it are restored on exit, and a signal noted and never taken is in `left`; installed
    with `install()`, it stays for the process's life (the job's supervisor: a signal after its loop
    must not end the process by its default action)."""

    def __init__(self, signums: tuple[int, ...]) -> None:
        self.signums = signums
        self._pending: list[int] = []
        self.fd, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._old_handlers: dict[int, Any] = {}
        self._old_wakeup = -1

    def install(self) -> Self:
        self._old_wakeup = signal.set_wakeup_fd(self._w)
        for signum in self.signums:
            self._old_handlers[signum] = signal.signal(signum, self._note)
        return self

    def __enter__(self) -> Self:
        return self.install()

    def _note(self, signum: int, frame: object) -> None:
        self._pending.append(signum)

    def take(self) -> list[int]:
        """The signals noted since the last take, oldest first (the wakeup pipe emptied)."""
        try:
            while os.read(self.fd, 512):
                pass
        except BlockingIOError:
            pass
        taken, self._pending = self._pending, []
        return taken

    @property
    def left(self) -> list[int]:
        return list(self._pending)

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self._old_wakeup)
        os.close(self.fd)
        os.close(self._w)
