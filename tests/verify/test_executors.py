"""`--executor ray` against the local executor, on a real Ray cluster of two one-CPU nodes on this machine.

The same smoke units give the same claims (verdicts, our values, every number) whichever executor ran them;
a worker node killed in the middle of a sweep still ends with every unit done and cached exactly once; an
unreachable cluster address is a one-line error.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from claims_json import claims_of as _claims
from claims_json import same
from claims_json import strip as _strip

from verify.cli import main

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.slow

#: Claims whose smoke units cover every kind of experiment unit (theory, kappa, NTK distance, malleability,
#: landscape, influence retraining, the centred variant) under both protocols.
ONLY = "thm4.2,kappa-mnist,ntk-relu-mnist,flip-binary-mnist,landscape-mnist,influence-retrain,ntk-attn-centred-mnist"
#: Floats agree to this relative tolerance: a Ray worker runs BLAS with one thread (Ray sets OMP_NUM_THREADS
#: to the task's CPUs), which changes the summation order of float64 reductions at the 1e-15 level.
REL = 1e-9


def _same(a, b) -> list[str]:
    return same(a, b, REL)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    assert main(["claims", "--preset", "smoke", "--only", ONLY, "--out", str(out), "--no-pdf"]) == 0
    return out


@pytest.fixture()
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    yield c
    c.shutdown()


def test_ray_gives_the_local_numbers(local_run, cluster, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NTKM_PROGRESS", "1")  # the progress lines are what this test reads (CI silences them)
    cluster.add_node(num_cpus=1)
    cluster.add_node(num_cpus=1)
    out = tmp_path / "ray"
    rc = main(["claims", "--preset", "smoke", "--only", ONLY, "--out", str(out), "--no-pdf", "--executor", "ray",
               "--ray-address", cluster.address])
    assert rc == 0
    err = capsys.readouterr().err
    assert "[ray]" in err and "[done]" in err
    assert _same(_claims(out), _claims(local_run)) == []
    rec = json.loads((out / "claims.json").read_text())
    assert rec["executor"]["name"] == "ray" and not any(u["cached"] for u in rec["units"].values())
    # the cache is the local executor's: a local --resume recomputes nothing
    assert main(["claims", "--preset", "smoke", "--only", ONLY, "--out", str(out), "--no-pdf", "--resume"]) == 0
    rec = json.loads((out / "claims.json").read_text())
    assert all(u["cached"] for u in rec["units"].values())


def test_killing_a_worker_node_mid_sweep_loses_and_duplicates_nothing(local_run, cluster, tmp_path):
    first = cluster.add_node(num_cpus=1)
    cluster.add_node(num_cpus=1)  # where the lost task goes (nodes are added here: Ray needs the main thread)
    out = tmp_path / "killed"
    cache = out / "cache"
    killed = threading.Event()
    done_at_kill: list[int] = []

    def kill_after_first_result() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not list(cache.glob("*.json")):
            time.sleep(0.05)
        done_at_kill.append(len(list(cache.glob("*.json"))))
        cluster.remove_node(first)  # its raylet and the worker running a unit on it die
        killed.set()

    killer = threading.Thread(target=kill_after_first_result, daemon=True)
    killer.start()
    rc = main(["claims", "--preset", "smoke", "--only", ONLY, "--out", str(out), "--no-pdf", "--executor", "ray",
               "--ray-address", cluster.address])
    killer.join(timeout=60)
    assert killed.is_set() and rc == 0
    rec = json.loads((out / "claims.json").read_text())
    names = sorted(rec["units"])
    files = sorted(p.name for p in cache.glob("*.json"))
    assert done_at_kill[0] <= len(names) - 2  # both nodes still had a unit to run when one was killed
    assert len(files) == len(names)  # one cache entry per unit: nothing lost, nothing twice
    assert sorted(json.loads(p.read_text())["unit"] for p in cache.glob("*.json")) == names
    assert _same(_claims(out), _claims(local_run)) == []


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("address, needle", [
    (f"127.0.0.1:{_closed_port()}", "unreachable"),
    ("no-port-here", "is not HOST:PORT"),
], ids=["closed-port", "no-port"])  # ids that do not name the port: every xdist worker collects the same tests
def test_bad_ray_address_is_one_line(address, needle, tmp_path, capsys):
    t0 = time.monotonic()
    rc = main(["claims", "--preset", "smoke", "--only", "thm4.1", "--out", str(tmp_path / "o"), "--executor", "ray",
               "--ray-address", address])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and needle in err and len(err.splitlines()) == 1, err
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "o" / "claims.json").exists()


def test_ray_address_needs_the_ray_executor(tmp_path, capsys):
    rc = main(["claims", "--preset", "smoke", "--only", "thm4.1", "--out", str(tmp_path / "o"),
               "--ray-address", "127.0.0.1:6379"])
    assert rc == 2 and "needs --executor ray" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["malleability", "ntk-distance", "landscape"])
def test_single_command_seeds_on_ray_match_local(command, cluster, tmp_path):
    """`verify <command> --executor ray` runs one Ray task per seed and assembles the same record."""
    cluster.add_node(num_cpus=1)
    cluster.add_node(num_cpus=1)
    argv = [command, "--preset", "smoke", "--seeds", "2", "--epochs", "5", "--n-train", "40", "--n-test", "20"]
    argv += {"malleability": ["--attack", "fgsm", "--intervention", "transformed"],
             "ntk-distance": ["--widths", "16,64"], "landscape": ["--width", "32"]}[command]
    assert main(argv + ["--json", str(tmp_path / "local.json")]) == 0
    assert main(argv + ["--json", str(tmp_path / "ray.json"), "--executor", "ray", "--ray-address",
                        cluster.address]) == 0
    local, remote = (json.loads((tmp_path / f).read_text()) for f in ("local.json", "ray.json"))
    assert remote.pop("executor") == "ray" and local.pop("executor") == "local"
    assert _same(_strip(remote), _strip(local)) == []
