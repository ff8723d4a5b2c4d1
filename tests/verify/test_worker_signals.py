"""`verify claims --jobs N` ends cleanly on signals and never hangs on a dead worker (issues 39 item 5 and 42).

SIGTERM or SIGINT to a two-worker smoke run once a worker runs a unit: the command exits 143 or 130 within 10 s with
its one interrupt line, and none of its processes (the workers, multiprocessing's resource tracker) is left. SIGKILL
to the driver: the kernel ends its workers too (PR_SET_PDEATHSIG, Linux). A worker killed by SIGKILL while it runs a
unit (as the out-of-memory killer does): the run does not hang, the other workers run the other units (cached), and
a one-line `UserInputError` names the lost unit and the signal; with every worker dead, also the units not started.
Every wait here is bounded, and the subprocess runs in its own session, killed as a group whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ntkm.errors import UserInputError
from verify.executors import ExecutorConfig, run_units
from verify.runner import Cache, Unit

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process tree from /proc")

ROOT = Path(__file__).resolve().parents[2]
#: Seconds the driver may take to end after the signal (measured: 0.7 s with two workers on 2 cores).
END_S = 10.0
#: Seconds until a worker runs its first unit (measured: 5-7 s on 2 cores; generous for a loaded machine).
START_S = 180.0


def value_unit(a: int) -> dict:
    """A unit that returns its input (module level: a spawned worker imports it by name)."""
    return {"value": a}


def sigkill_unit(a: int) -> dict:
    """A unit whose worker is killed by SIGKILL while running it, as by the out-of-memory killer."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("not reached")


def _children(pid: int) -> set[int]:
    """The child processes of `pid` (every thread's children, from /proc)."""
    out: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out |= {int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()}
    return out


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


def _wait_gone(pids: set[int], timeout: float) -> set[int]:
    """The processes of `pids` still running after up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (left := {p for p in pids if _alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGKILL, -9)],
                         ids=["SIGTERM", "SIGINT", "SIGKILL"])
def test_a_signal_ends_a_two_worker_run_and_every_worker(sig: signal.Signals, code: int, tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NTKM_PROGRESS": "1"}
    argv = [sys.executable, "-m", "verify", "claims", "--preset", "smoke", "--jobs", "2", "--no-pdf",
            "--out", str(tmp_path / "out")]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    kids: set[int] = set()
    try:
        deadline = time.monotonic() + START_S
        while not (seen and seen[-1].startswith("[run]") and "[worker" in seen[-1]):
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, f"the run ended before a worker ran a unit:\n{''.join(seen)}"
            seen.append(line)
        kids = _children(proc.pid)
        workers = {p for p in kids if "multiprocessing.spawn" in _cmdline(p)}
        assert len(workers) == 2, {p: _cmdline(p) for p in kids}
        t0 = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=END_S)
        took = time.monotonic() - t0
        left = _wait_gone(kids, timeout=5.0)
        rest = []
        while (line := lines.get(timeout=5.0)) is not None:
            rest.append(line)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for p in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        proc.wait(timeout=10)
    print(f"{sig.name}: the run ended {took:.2f} s after the signal")
    assert proc.returncode == code, "".join(seen + rest)
    assert took < END_S
    assert not left, {p: _cmdline(p) for p in left}
    if sig != signal.SIGKILL:
        err = "".join(rest)
        assert "Traceback" not in err, err
        last = [ln for ln in rest if ln.strip()][-1]
        assert f"interrupted ({sig.name})" in last and "--resume" in last, err


def _bounded(fn, timeout: float) -> BaseException | None:
    """Call `fn` in a thread; the exception it raised (None if none); fail if it has not returned within `timeout`."""
    box: list[BaseException | None] = [None]

    def call() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            box[0] = exc

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"still waiting {timeout} s later: the driver hangs on a dead worker"
    return box[0]


def _spawned_children() -> set[int]:
    return {p for p in _children(os.getpid()) if _alive(p) and "multiprocessing.spawn" in _cmdline(p)}


def test_a_worker_killed_while_running_a_unit_is_one_line_and_the_others_finish(tmp_path: Path):
    cache = Cache(tmp_path / "cache")
    units = [Unit("fine-1", {"a": 1}, value_unit), Unit("dies", {"a": 2}, sigkill_unit),
             Unit("fine-2", {"a": 3}, value_unit), Unit("fine-3", {"a": 4}, value_unit)]
    lines: list[str] = []
    before = _spawned_children()
    exc = _bounded(lambda: run_units(units, cache, lines.append, ExecutorConfig(jobs=2)), timeout=120)
    assert isinstance(exc, UserInputError), repr(exc)
    msg = str(exc)
    assert "\n" not in msg
    assert "dies (worker" in msg and "killed by SIGKILL" in msg and "--resume" in msg, msg
    assert "fine-" not in msg and "not started" not in msg, msg
    assert any(ln.startswith("[failed]") and "dies" in ln for ln in lines), lines
    # the surviving worker ran the other units, each cached; the lost one is not
    assert all(cache.get(u) is not None for u in units if u.name != "dies")
    assert cache.get(units[1]) is None
    assert not _spawned_children() - before


def test_every_worker_dead_stops_the_run_naming_the_units_not_started(tmp_path: Path):
    cache = Cache(tmp_path / "cache")
    units = [Unit(f"dies-{i}", {"a": i}, sigkill_unit) for i in range(3)]
    exc = _bounded(lambda: run_units(units, cache, lambda _: None, ExecutorConfig(jobs=2)), timeout=120)
    assert isinstance(exc, UserInputError), repr(exc)
    msg = str(exc)
    assert msg.count(", killed by SIGKILL)") == 2 and "1 unit(s) not started (no worker left)" in msg, msg
    assert "\n" not in msg and "--resume" in msg
