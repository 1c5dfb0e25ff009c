"""slurmkit.supervisor.signal_inbox: signals noted, then taken where the loop chooses."""

from __future__ import annotations

import os
import select
import signal

from slurmkit.supervisor.signal_inbox import SignalInbox


def test_signals_are_noted_in_order_wake_the_select_and_are_taken_once() -> None:
    with SignalInbox((int(signal.SIGUSR1), int(signal.SIGUSR2))) as inbox:
        assert select.select([inbox.fd], [], [], 0)[0] == []
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert select.select([inbox.fd], [], [], 5)[0] == [inbox.fd]
        assert inbox.take() == [signal.SIGUSR2, signal.SIGUSR1]
        assert inbox.take() == []
        assert select.select([inbox.fd], [], [], 0)[0] == []  # the wakeup pipe was emptied


def test_the_handlers_before_are_restored_and_an_untaken_signal_is_left() -> None:
    seen: list[int] = []
    before = signal.signal(signal.SIGUSR1, lambda signum, _frame: seen.append(signum))
    wakeup_before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup_before)
    try:
        with SignalInbox((int(signal.SIGUSR1),)) as inbox:
            os.kill(os.getpid(), signal.SIGUSR1)
            left = inbox.left
        assert left == [signal.SIGUSR1]
        assert seen == []  # noted only, while the inbox was installed
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == [signal.SIGUSR1]  # the handler before it is back
        assert signal.set_wakeup_fd(wakeup_before) == wakeup_before  # and so is the wakeup fd
    finally:
        signal.signal(signal.SIGUSR1, before)
