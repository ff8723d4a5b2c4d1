"""SIGINT and SIGTERM as one interrupt that is never lost.

The handler records the signal and raises `KeyboardInterrupt` in the main thread. Python swallows an
exception raised inside a finalizer or a weakref callback ("Exception ignored in ..."): when the signal
happens to land there (measured in CI: a weakref callback while weasyprint renders a PDF), the raise would
vanish and the command would run on and exit 0. `_unraisable` drops that message and sends the signal
again from a helper thread (`_thread.interrupt_main`), so it is delivered in the main thread once the finalizer
has returned; `checkpoint()` (called before an
output set is swapped in, and when a command returns) raises for any signal that arrived, as a last guard.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
from types import FrameType
from typing import Any

#: Exit codes of an interrupted command, by signal: 128 + the signal number.
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
#: The signals received since `install()` (in order).
received: list[int] = []
_previous_hook = sys.unraisablehook
_pending: list[threading.Timer] = []
#: Delay before a swallowed interrupt is re-delivered (seconds): long enough for the finalizer to return.
REDELIVERY_S = 0.05


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """Remember which signal came and unwind the command as an interrupt."""
    received.append(signum)
    raise KeyboardInterrupt


def _unraisable(unraisable: Any) -> None:
    """A KeyboardInterrupt of ours that a finalizer swallowed: re-deliver it (silently) outside the finalizer."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and received:
        if signal.getsignal(received[-1]) is _on_signal:  # raised here it would be swallowed again: a bit later
            timer = threading.Timer(REDELIVERY_S, _redeliver, args=(received.pop(),))
            timer.daemon = True
            _pending.append(timer)
            timer.start()
        return
    _previous_hook(unraisable)


def _redeliver(signum: int) -> None:
    """Deliver a swallowed interrupt to the main thread, only while our handler is still the one installed (a
    command that has since ended, or is reporting its interrupt, gets none)."""
    if signal.getsignal(signum) is _on_signal:
        _thread.interrupt_main(signum)


def _cancel_pending() -> None:
    while _pending:
        _pending.pop().cancel()


def install() -> None:
    """Handle SIGTERM like SIGINT (main thread only; elsewhere the defaults stay); forget earlier signals."""
    global _previous_hook
    received.clear()
    _cancel_pending()
    try:
        for sig in EXIT_CODES:
            signal.signal(sig, _on_signal)
    except ValueError:
        return
    if sys.unraisablehook is not _unraisable:
        _previous_hook = sys.unraisablehook
    sys.unraisablehook = _unraisable


def ignore() -> None:
    """Ignore further SIGINT/SIGTERM (while the interrupt is being reported)."""
    _cancel_pending()
    for sig in EXIT_CODES:
        signal.signal(sig, signal.SIG_IGN)


def checkpoint() -> None:
    """Raise `KeyboardInterrupt` if a signal arrived whose raise did not reach the main code."""
    if received:
        raise KeyboardInterrupt
