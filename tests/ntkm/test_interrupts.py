"""An interrupt is never lost, even when the signal lands inside a finalizer (CI, stop 46: a weakref callback
during PDF rendering swallowed the KeyboardInterrupt and the report exited 0)."""

from __future__ import annotations

import signal
import sys
import time
import weakref
from pathlib import Path

import pytest

from ntkm import interrupts
from verify.outputs import output_set


@pytest.fixture
def handlers():
    saved = {sig: signal.getsignal(sig) for sig in interrupts.EXIT_CODES}
    hook = sys.unraisablehook
    yield
    for sig, h in saved.items():
        signal.signal(sig, h)
    sys.unraisablehook = hook
    interrupts.received.clear()


class _Thing:
    pass


def _signal_inside_a_weakref_callback() -> None:
    """Drop an object whose weakref callback receives SIGINT and runs on: the handler fires inside it."""
    def callback(_: object) -> None:
        signal.raise_signal(signal.SIGINT)
        sum(range(1000))

    thing = _Thing()
    ref = weakref.ref(thing, callback)
    del thing
    assert ref() is None


def test_a_signal_inside_a_finalizer_reaches_the_main_code(handlers):
    interrupts.install()
    with pytest.raises(KeyboardInterrupt):
        _signal_inside_a_weakref_callback()
        for _ in range(500):
            time.sleep(0.01)
    assert interrupts.received == [signal.SIGINT]


def test_without_the_hook_the_interrupt_is_swallowed_and_checkpoint_still_catches_it(handlers):
    """The failure the hook fixes (so the test above can fail), and the last guard behind it."""
    interrupts.install()
    sys.unraisablehook = lambda u: None
    _signal_inside_a_weakref_callback()
    for _ in range(50):
        time.sleep(0.01)  # no KeyboardInterrupt reaches here
    assert interrupts.received == [signal.SIGINT]
    with pytest.raises(KeyboardInterrupt):
        interrupts.checkpoint()


def test_an_output_set_is_not_swapped_in_after_a_swallowed_signal(handlers, tmp_path: Path):
    interrupts.install()
    interrupts.received.append(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), output_set(tmp_path / "out", ["a.txt"]) as s:
        s.path("a.txt").write_text("new")
    assert not (tmp_path / "out").exists()


def test_other_unraisable_errors_still_reach_the_previous_hook(handlers):
    seen = []
    sys.unraisablehook = seen.append  # the hook in place when the command starts (the fixture restores pytest's)
    interrupts.install()

    class Bad:
        def __del__(self) -> None:
            raise ValueError("from a finalizer")

    Bad()
    assert len(seen) == 1 and isinstance(seen[0].exc_value, ValueError)
