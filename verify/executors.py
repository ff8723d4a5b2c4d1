"""Where experiment units run: on this machine (`local`) or as Ray tasks on a cluster (`ray`); one cache either way.

The local executor runs the units one after another in this process (`Cache.run`) with `jobs` 1, and with more
jobs in that many worker processes (started with 'spawn', one torch thread each unless `NTKM_THREADS` says
otherwise): the units that share trained networks form a group (`verify.costs.groups`; a worker trains such a
network once, as one process running them in turn would), and the groups go to the workers longest first by
the cost model (`verify.costs.longest_first`), each worker taking the next when it is free. A worker runs its
units through the same `Cache.run`: the same per-unit lock, the same atomic cache entry the moment a unit
finishes. A worker loads the code of theory/ and empirics/ when it starts; if that is not the code the run started
with (the source changed since), it says so and keys its units by the code it runs.

The workers are `multiprocessing` processes ('spawn'), each with its own pipe: the driver gives a worker one group
at a time, so it always knows which units each worker holds, and waits on the pipes and the processes' sentinels
together, so a worker's death is seen as soon as its results are. Not `multiprocessing.Pool`: it replaces a dead worker
and never reports the group that worker held (the run waited forever), and its terminate can block joining its
handler threads and workers. Not `concurrent.futures.ProcessPoolExecutor`: it reports a dead worker
(BrokenProcessPool) but neither which worker nor which task, ends every other worker's work with it, and its shutdown
does not end running workers. On SIGINT or SIGTERM (the CLI's handler raises KeyboardInterrupt in the driver) every
worker gets SIGTERM, any still running `END_GRACE_S` (3 s) later SIGKILL, and all are reaped before the command exits
130 or 143 (the workers ignore SIGINT, so a Ctrl-C reaches only the driver's handler); the units in progress are
lost, finished units stay cached for `--resume`. A worker that dies while running a group (killed by a signal, as
by the out-of-memory killer's SIGKILL, or exiting) loses that group; the other workers go on with the remaining
groups, and the run then stops with a one-line `UserInputError` naming the lost units and how their worker ended
(finished units are cached; `--resume` continues). An exception raised in a worker (a unit's bad input,
`UserInputError`) ends the other workers and is raised by the driver. A worker dies with the driver: on Linux the
kernel kills it (SIGKILL) when the driver dies, however (prctl PR_SET_PDEATHSIG), so no worker goes on writing
cache entries for a run that is gone.

The Ray executor submits every unit that is not cached as one Ray task with the resources it needs
(`cpus_per_unit` CPUs, and a GPU per unit when the device is cuda). A worker imports the installed suite,
checks that its code is the driver's (the code version in the cache key; a node with another commit
refuses), and calls the same unit function; the driver writes each result into the same cache as the local executor
(`Cache.store`), so `--resume`, the reports and claims.json do not depend on where a unit ran. A task
lost with its worker or node is retried by Ray (`max_retries`); every unit is stored exactly once, by
the driver. A unit whose input is bad (`UserInputError`: missing data, no CUDA) stops the run with its
one-line error and is not cached; any other failure of a unit is reported by name after the others
finish (they stay cached for `--resume`).

Ray is the engine: scheduling, placement, retries and node failures are Ray's; this module only maps
units to tasks and results to the cache.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import signal
import socket
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from ntkm.errors import UserInputError
from verify.runner import Cache, Unit, UnitResult, input_error

EXECUTORS = ("local", "ray")
Log = Callable[[str], None]


@dataclass(frozen=True)
class ExecutorConfig:
    """`name`: local or ray. `address`: an existing Ray cluster (HOST:PORT, `auto`, or ray://HOST:PORT);
    None starts a local Ray runtime on this machine. `cpus_per_unit` / `gpus_per_unit`: the resources of
    each unit's task. `max_retries`: how often Ray reruns a task whose worker or node died. The fields' metadata
    are the command-line options (`verify.commands.options.EXECUTOR`)."""

    name: str = field(default="local", metadata={
        "flag": "--executor", "help": "where experiment units run: local (this machine: for claims in --jobs worker "
        "processes, elsewhere one after another; default) or ray (one Ray task per unit; pip install -e '.[ray]')"})
    address: str | None = field(default=None, metadata={
        "flag": "--ray-address", "metavar": "ADDR", "help": "an existing Ray cluster (HOST:PORT as printed by 'ray "
        "start --head', or auto); without it --executor ray starts a local Ray runtime"})
    cpus_per_unit: float = field(default=1.0, metadata={
        "help": "CPUs each unit's Ray task reserves (torch uses that many threads in it; default: %(default)s)"})
    gpus_per_unit: float = 0.0
    max_retries: int = 3
    #: Worker processes of the local executor (1: the units one after another in this process).
    jobs: int = 1

    def __post_init__(self) -> None:
        if self.name not in EXECUTORS:
            raise UserInputError(f"unknown executor '{self.name}'; choose local or ray")
        if self.address is not None and self.name != "ray":
            raise UserInputError("--ray-address needs --executor ray")
        if not self.cpus_per_unit > 0 or self.gpus_per_unit < 0 or self.max_retries < 0:
            raise UserInputError("--cpus-per-unit must be > 0 (and GPUs per unit and retries >= 0)")
        if not isinstance(self.jobs, int) or self.jobs < 1:
            raise UserInputError(f"--jobs must be a whole number >= 1, got {self.jobs}; e.g. --jobs 2")


def executor_from_args(args: Any, device: str | None = None) -> ExecutorConfig:
    """The executor that the command-line options describe; a cuda device reserves one GPU per unit."""
    gpus = 1.0 if (device or "").startswith("cuda") and args.executor == "ray" else 0.0
    return ExecutorConfig(args.executor, args.ray_address, args.cpus_per_unit, gpus)


def run_units(units: list[Unit], cache: Cache, log: Log, ex: ExecutorConfig) -> dict[str, tuple[UnitResult, bool]]:
    """(result, was_cached) for every unit, in the order given, computed where `ex` says."""
    if ex.name == "ray":
        return _run_ray(units, cache, log, ex)
    if ex.jobs > 1:
        return _run_parallel(units, cache, log, ex.jobs)
    out = {}
    for i, u in enumerate(units, 1):
        log(f"({i}/{len(units)})")
        out[u.name] = cache.run(u, log)
    return out


# ---- local worker processes ----------------------------------------------------------------------------------

#: Resident memory one worker may need: the peak of a whole quick run in one process (4.4 GB, README), so that
#: the default number of workers fits in the memory available.
WORKER_BYTES = 4.4e9


def _available_memory() -> float | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_jobs(threads: int = 1) -> int:
    """Worker processes by default: the usable cores (this process's CPU affinity) over the torch threads per
    worker, and no more than the available memory holds at `WORKER_BYTES` each."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    jobs = cores // max(1, threads)
    mem = _available_memory()
    if mem is not None:
        jobs = min(jobs, int(mem // WORKER_BYTES))
    return max(1, jobs)


#: In a worker: the code version of what it loaded when it started.
_LOADED: list[str] = []

#: Seconds the workers have to exit once told to stop (the run finished), to end after SIGTERM (an interrupt, an
#: error) before they get SIGKILL, and to be reaped after SIGKILL.
STOP_GRACE_S = 10.0
END_GRACE_S = 3.0
KILL_WAIT_S = 5.0
#: prctl(2) option of Linux: the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int | None) -> None:
    """A worker: the kernel kills it (SIGKILL) when the driver dies, however the driver dies (Linux's
    PR_SET_PDEATHSIG; a no-op elsewhere), and it exits at once if the driver died before that was set (its parent
    is no longer `parent`). The kernel's parent is the thread that started the worker: `_run_groups`, which ends
    its workers before it returns."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def _worker_init(threads: int, parent: int | None = None) -> None:
    """A worker: it dies with the driver (`parent`, `_die_with_parent`), Ctrl-C goes to the driver (which ends the
    workers), SIGTERM ends it silently, torch uses `threads` threads, progress bars are off (two workers' bars would
    overwrite each other's line); it loads every module of theory/ and empirics/ now and records that code's version
    (`_run_group` keys its units by it); float32 arithmetic is pinned to IEEE on CUDA (`empirics.precision`)."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import pkgutil

    import torch

    import empirics
    import theory
    from empirics.precision import set_float32_math
    from verify.runner import code_version

    os.environ["NTKM_PROGRESS_BARS"] = "0"
    torch.set_num_threads(max(1, threads))
    set_float32_math()
    for pkg in (theory, empirics):
        for mod in pkgutil.walk_packages(pkg.__path__, f"{pkg.__name__}."):
            with contextlib.suppress(ImportError):
                importlib.import_module(mod.name)
    _LOADED.append(code_version())


def _run_group(cache: Cache, group: list[Unit]) -> list[tuple[str, UnitResult, bool]]:
    """In a worker: the group's units one after another through the cache (its log lines name the worker)."""
    from empirics.progress import log

    tag = multiprocessing.current_process().name.rsplit("-", 1)[-1]
    mine = _LOADED[-1] if _LOADED else cache.version
    if mine != cache.version:  # the source changed after the run started: key the units by the code that runs them
        log(f"[note]   worker {tag} runs code version {mine} (the run started with {cache.version}: theory/ or "
            f"empirics/ changed since); its units are cached under {mine}")
        cache = Cache(cache.folder, mine)
    out = []
    for u in group:
        res, cached = cache.run(u, lambda msg: log(f"{msg}  [worker {tag}]"))
        out.append((u.name, res, cached))
    return out


def _worker_main(conn: Connection, cache: Cache, threads: int, parent: int) -> None:
    """A worker process: set up (`_worker_init`) and say ("ready", None) on `conn`; then run each group the driver
    sends and answer ("done", its results); None, or the driver gone, ends it. An exception is sent as ("error",
    the exception, its traceback text) for the driver to raise."""
    try:
        _worker_init(threads, parent)
        conn.send(("ready", None))
        while True:
            try:
                group = conn.recv()
            except EOFError:
                return
            if group is None:
                return
            conn.send(("done", _run_group(cache, group)))
    except KeyboardInterrupt:  # a Ctrl-C before the worker ignores it: the driver had it too and ends the run
        return
    except Exception as exc:
        text = "".join(traceback.format_exception(exc))
        try:
            conn.send(("error", exc, text))
        except Exception:  # an exception that does not pickle: its type and message
            with contextlib.suppress(OSError):
                conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}"), text))


class _RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker, attached to it as its cause."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\"\"\"\n{self.text}\"\"\""


@dataclass
class _Worker:
    """The driver's view of one worker process: its end of the pipe, whether the worker has set up (`ready`), the
    group it runs (None: idle), and whether the pipe is still open (`readable`: not at end-of-file)."""

    tag: int
    proc: Any
    conn: Any
    ready: bool = False
    group: list[Unit] | None = None
    readable: bool = True


def _exit_reason(code: int | None) -> str:
    """How a process ended, from its exit code (negative: the signal that killed it)."""
    if code is None:
        return "ended"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _end_workers(pool: list[_Worker], polite: bool) -> None:
    """End every started worker and reap it: told to stop (`polite`, idle workers after a finished run) or not,
    each step waits for those still running and moves on to a harsher one: SIGTERM, then after `END_GRACE_S` SIGKILL.
    A signal that arrives meanwhile (the driver's handler raises KeyboardInterrupt) skips to the next step and is
    raised once every worker has been ended."""
    procs = [w.proc for w in pool if w.proc.pid is not None]
    steps = (["stop"] if polite else []) + ["term", "kill"]
    grace = {"stop": STOP_GRACE_S, "term": END_GRACE_S, "kill": KILL_WAIT_S}
    interrupt: BaseException | None = None
    for step in steps:
        try:
            for w in pool:
                if w.proc.pid is None or not w.proc.is_alive():
                    continue
                if step == "stop":
                    with contextlib.suppress(OSError, ValueError):
                        w.conn.send(None)
                elif step == "term":
                    w.proc.terminate()
                else:
                    w.proc.kill()
            deadline = time.monotonic() + grace[step]
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt as exc:
            interrupt = exc
            continue
        if not any(p.is_alive() for p in procs):
            break
    for w in pool:
        with contextlib.suppress(OSError):
            w.conn.close()
    if interrupt is not None:
        raise interrupt


def _receive(w: _Worker, out: dict[str, tuple[UnitResult, bool]], log: Log, total: int) -> None:
    """Read one message of worker `w`: it is ready, or its group's results go into `out` (with a progress line), or
    the exception it raised is raised here, with its traceback in the worker as the cause."""
    try:
        kind, body, *rest = w.conn.recv()
    except (EOFError, OSError):
        w.readable = False
        return
    except Exception as exc:  # a message that does not unpickle here
        raise RuntimeError(f"worker {w.tag}: its message could not be read ({type(exc).__name__}: {exc})") from exc
    if kind == "error":
        if rest:
            body.__cause__ = _RemoteTraceback(rest[0])
        raise body
    if kind == "ready":
        w.ready = True
        return
    for name, res, cached in body:
        out[name] = (res, cached)
    w.group = None
    log(f"[local]  {len(out)}/{total} unit(s) finished")


def _run_groups(tasks: list[list[Unit]], cache: Cache, log: Log, jobs: int,
                threads: int) -> dict[str, tuple[UnitResult, bool]]:
    """(result, was_cached) of every unit of `tasks` (groups, in the order to start them), run in `jobs` worker
    processes, each taking the next group when it is free; raises a worker's exception (ending the others), or,
    once the others are done, a `UserInputError` naming the units of workers that died while running them."""
    ctx = multiprocessing.get_context("spawn")
    queue = deque(tasks)
    total = sum(len(g) for g in tasks)
    out: dict[str, tuple[UnitResult, bool]] = {}
    pool: list[_Worker] = []
    lost: list[str] = []
    finished = False
    try:
        for tag in range(1, jobs + 1):
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(there, cache, threads, os.getpid()),
                               name=f"verify-worker-{tag}", daemon=True)
            pool.append(_Worker(tag, proc, here))
            proc.start()
            there.close()
        live = list(pool)
        while live and (queue or any(w.group is not None for w in live)):
            for w in live:
                if queue and w.ready and w.group is None and w.readable:
                    w.group = queue.popleft()
                    try:
                        w.conn.send(w.group)
                    except OSError:  # it is ending: the group goes to another worker
                        queue.appendleft(w.group)
                        w.group, w.readable = None, False
            ready = set(wait([w.conn for w in live if w.readable] + [w.proc.sentinel for w in live]))
            for w in list(live):
                if w.readable and w.conn in ready:
                    _receive(w, out, log, total)
                if w.proc.sentinel not in ready:
                    continue
                while w.readable and w.conn.poll():  # what it sent before it ended
                    _receive(w, out, log, total)
                live.remove(w)
                w.proc.join(1.0)
                why = _exit_reason(w.proc.exitcode)
                if w.group is None:
                    log(f"[local]  worker {w.tag} {why} while idle; {len(live)} worker(s) go on")
                    continue
                names = ", ".join(u.name for u in w.group)
                log(f"[failed] worker {w.tag} {why} while running {names}; {len(live)} worker(s) go on")
                lost.append(f"{names} (worker {w.tag}, {why})")
                w.group = None
        finished = True
        if lost or queue:
            left = sum(len(g) for g in queue)
            raise UserInputError(
                f"worker processes ended while running units, which are lost: {'; '.join(lost) or 'none'}"
                + (f"; {left} unit(s) not started (no worker left)" if left else "")
                + "; the finished units are cached: rerun with --resume to continue (a worker killed by SIGKILL is "
                "often the out-of-memory killer: try fewer --jobs)")
    finally:
        _end_workers(pool, polite=finished)
    return out


def _split_cached(units: list[Unit], cache: Cache, log: Log) -> tuple[dict[str, tuple[UnitResult, bool]], list[Unit]]:
    """The units the cache holds, as (result, True), and the others, in the order given."""
    out: dict[str, tuple[UnitResult, bool]] = {}
    todo = []
    for u in units:
        hit = cache.get(u)
        if hit is not None:
            log(f"[cached] {u.name}")
            out[u.name] = (hit, True)
        else:
            todo.append(u)
    return out, todo


def _run_parallel(units: list[Unit], cache: Cache, log: Log, jobs: int) -> dict[str, tuple[UnitResult, bool]]:
    from verify.costs import longest_first

    out, todo = _split_cached(units, cache, log)
    by_name = {u.name: u for u in todo}
    tasks = [[by_name[n] for n in g] for g, _ in longest_first([(u.name, u.config) for u in todo])]
    workers = min(jobs, len(tasks))
    if workers <= 1:
        for u in todo:
            out[u.name] = cache.run(u, log)
        return {u.name: out[u.name] for u in units}
    import torch

    log(f"[local]  {len(todo)} unit(s) in {len(tasks)} group(s) of units sharing trained networks, on {workers} "
        "worker processes, longest first")
    out.update(_run_groups(tasks, cache, log, workers, torch.get_num_threads()))
    return {u.name: out[u.name] for u in units}


# ---- Ray ----------------------------------------------------------------------------------------------

def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserInputError("--executor ray needs Ray, which is not installed; pip install -e '.[ray]'") from None
    return ray


def check_address(address: str | None, timeout_s: float = 5.0) -> None:
    """A one-line error, within `timeout_s`, when a cluster address is malformed or nothing listens there
    (Ray itself would wait much longer before giving up)."""
    if address in (None, "", "auto"):
        return
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()):
        raise UserInputError(f"--ray-address '{address}' is not HOST:PORT (e.g. 10.0.0.5:6379, as printed by "
                             "'ray start --head'), ray://HOST:PORT or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UserInputError(f"--ray-address {address} is unreachable ({exc.strerror or exc}); start the head with "
                             "'ray start --head' and pass the address it prints") from None


@contextlib.contextmanager
def ray_session(ray: Any, address: str | None) -> Any:
    """Connect to (or start) Ray unless this process is already connected; disconnect only what we opened."""
    if ray.is_initialized():
        yield
        return
    check_address(address)
    import logging

    try:
        ray.init(address=address, log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING,
                 configure_logging=True)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise UserInputError(f"could not connect to Ray at {address or 'a new local runtime'}: "
                             f"{str(exc).splitlines()[0][:200]}") from None
    try:
        yield
    finally:
        ray.shutdown()


def execute_unit(module: str, name: str, config: dict[str, Any], version: str, threads: int) -> dict[str, Any]:
    """Run one unit where Ray placed it: the same function the local executor calls, with the driver's code."""
    import torch

    from verify.runner import code_version

    torch.set_num_threads(max(1, threads))
    host = socket.gethostname()
    mine = code_version()
    if mine != version:
        raise UserInputError(f"worker {host} runs other code (version {mine}, the driver's is {version}); install the "
                             "same commit of the suite on every node")
    fn = getattr(importlib.import_module(module), name)
    t0 = time.perf_counter()
    result = fn(**config)
    return {"result": result, "wall_s": time.perf_counter() - t0, "node": host, "pid": os.getpid()}


def _cause(exc: BaseException) -> BaseException | None:
    """The exception a Ray task raised (unwrapped from Ray's error type), if Ray kept it."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else None


def _run_ray(units: list[Unit], cache: Cache, log: Log, ex: ExecutorConfig) -> dict[str, tuple[UnitResult, bool]]:
    ray = _import_ray()
    out, todo = _split_cached(units, cache, log)
    if todo:
        with ray_session(ray, ex.address), contextlib.ExitStack() as locks:
            for u in sorted(todo, key=lambda u: u.name):  # one order for every run: no lock cycles
                locks.enter_context(cache.claim(u, log))
            out.update(_submit_and_collect(ray, todo, cache, log, ex))
    return {u.name: out[u.name] for u in units}


def _submit_and_collect(ray: Any, todo: list[Unit], cache: Cache, log: Log,
                        ex: ExecutorConfig) -> dict[str, tuple[UnitResult, bool]]:
    out: dict[str, tuple[UnitResult, bool]] = {}
    task = _task(ray, execute_unit, ex)
    pending: dict[Any, str] = {}
    by_name = {u.name: u for u in todo}
    for u in todo:
        hit = cache.get(u)  # another run may have finished it while we waited for its lock
        if hit is not None:
            log(f"[cached] {u.name} (computed by another run)")
            out[u.name] = (hit, True)
            continue
        pending[task.remote(u.fn.__module__, u.fn.__name__, u.config, cache.version, _threads(ex))] = u.name

    def store(name: str, done: dict[str, Any]) -> None:
        out[name] = (cache.store(by_name[name], done["result"], done["wall_s"]), False)

    _collect(ray, pending, log, ex, store, lambda name, exc: input_error(by_name[name], exc))
    return out


def _threads(ex: ExecutorConfig) -> int:
    return max(1, int(ex.cpus_per_unit))


def _task(ray: Any, fn: Callable[..., Any], ex: ExecutorConfig) -> Any:
    return ray.remote(fn).options(num_cpus=ex.cpus_per_unit, num_gpus=ex.gpus_per_unit, max_retries=ex.max_retries,
                                  retry_exceptions=False)


def _collect(ray: Any, pending: dict[Any, str], log: Log, ex: ExecutorConfig,
             on_done: Callable[[str, dict[str, Any]], None],
             bad_input: Callable[[str, UserInputError], UserInputError]) -> None:
    """Wait for every task, hand each result to `on_done` as it arrives, log progress across the cluster; a
    task's `UserInputError` cancels the rest and is raised (via `bad_input`); other failures are raised
    together once every other task has finished."""
    res = ray.cluster_resources()
    log(f"[ray]    {len(pending)} task(s) submitted to a cluster of {res.get('CPU', 0):g} CPUs, "
        f"{res.get('GPU', 0):g} GPUs ({ex.cpus_per_unit:g} CPU{', 1 GPU' if ex.gpus_per_unit else ''} each)")
    total, failed = len(pending), []
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        name = pending.pop(ready[0])
        try:
            done = ray.get(ready[0])
        except Exception as exc:  # a Ray error wrapping the task's own exception, or a task lost for good
            cause = _cause(exc)
            if isinstance(cause, UserInputError):
                for ref in pending:
                    ray.cancel(ref, force=True)
                raise bad_input(name, cause) from None
            why = str(cause or exc).strip().splitlines()
            failed.append(f"{name}: {type(cause or exc).__name__}: {why[-1][:200] if why else ''}")
            log(f"[failed] {failed[-1]}")
            continue
        on_done(name, done)
        log(f"[done]   {name} in {done['wall_s']:.1f} s on {done['node']} "
            f"({total - len(pending) - len(failed)}/{total} done, {len(pending)} running or queued, "
            f"{len(failed)} failed)")
    if failed:
        raise UserInputError(f"{len(failed)} task(s) failed on the Ray cluster ({'; '.join(failed)}); fix the cause "
                             "and rerun (finished claims units are cached: --resume)")


# ---- the seeds of one experiment (verify ntk-distance / malleability / landscape) ------------------------

def execute_part(part: Callable[[int], Any], seed: int, version: str, threads: int) -> dict[str, Any]:
    """Run one seed of an experiment where Ray placed it, with the driver's code."""
    import torch

    from verify.runner import code_version

    torch.set_num_threads(max(1, threads))
    host = socket.gethostname()
    if code_version() != version:
        raise UserInputError(f"worker {host} runs other code than the driver; install the same commit of the suite "
                             "on every node")
    t0 = time.perf_counter()
    result = part(seed)
    return {"result": result, "wall_s": time.perf_counter() - t0, "node": host, "pid": os.getpid()}


def seed_map_for(ex: ExecutorConfig, log: Log, what: str) -> Callable[[Callable[[int], Any], Any], list[Any]]:
    """The `seed_map` of an experiment (`empirics.common.SeedMap`): its seeds one after another here, or one
    Ray task per seed."""
    if ex.name == "local":
        from empirics.common import local_map

        return local_map

    def ray_map(part: Callable[[int], Any], seeds: Any) -> list[Any]:
        from verify.runner import code_version

        ray = _import_ray()
        got: dict[str, Any] = {}
        with ray_session(ray, ex.address):
            task = _task(ray, execute_part, ex)
            version = code_version()
            pending = {task.remote(part, s, version, _threads(ex)): f"{what} seed {s}" for s in seeds}
            _collect(ray, pending, log, ex, lambda name, done: got.__setitem__(name, done["result"]),
                     lambda name, exc: UserInputError(f"{name}: {exc}"))
        return [got[f"{what} seed {s}"] for s in seeds]

    return ray_map
