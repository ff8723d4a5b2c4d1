"""The device image's environment (`benchmarks.device_image`): what the lent GPU machine lacks is absent in a
process run under it (and in the processes it starts), the carried wheels close pydantic's requirements, and what a
device call sends stays under the device tool's 64 MiB."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

from benchmarks import device_image as di

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import importlib.util, subprocess, sys
for name in ("weasyprint", "ray", "kronfluence", "trak"):
    assert importlib.util.find_spec(name) is None, name
    try:
        __import__(name)
    except ModuleNotFoundError:
        pass
    else:
        raise AssertionError(name + " imported")
import numpy, pydantic, scipy, torch  # on the image or carried
if len(sys.argv) == 1:  # a child process sees the same image
    sys.exit(subprocess.run([sys.executable, __file__, "child"]).returncode)
"""


def test_a_process_and_its_children_see_only_the_device_images_packages(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {**os.environ, **di.device_image_env()}
    res = subprocess.run([sys.executable, str(probe)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    # without the environment the same probe fails here, where weasyprint is installed (the test's positive control)
    plain = subprocess.run([sys.executable, str(probe)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert plain.returncode != 0 and "weasyprint" in plain.stderr


def test_blocked_and_allowed_modules_split_what_is_installed() -> None:
    blocked, allowed = di.blocked_modules(), di.allowed_modules()
    assert not blocked & allowed
    extras = {m for m in ("ray", "kronfluence", "trak") if importlib.util.find_spec(m) is not None}
    assert {"weasyprint", *extras} <= blocked  # the PDF's library (a core dependency) and the installed extras
    assert {"torch", "numpy", "scipy", "pydantic", "pydantic_core", "PIL", "yaml", "verify", "json"} <= allowed
    assert "tests" not in blocked  # the checkout's own folder travels


def test_the_carried_wheels_satisfy_the_suite_and_close_pydantics_requirements() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pyd = next(Requirement(d) for d in deps if Requirement(d).name == "pydantic")
    assert pyd.specifier.contains(di.CARRIED["pydantic"])
    have = di.device_distributions()
    carried = {di.normalise(k): v for k, v in di.CARRIED.items()}
    for dist in di.CARRIED:  # every requirement of a carried distribution is carried or on the image
        same_version = importlib.metadata.version(dist) == di.CARRIED[dist]  # then its metadata is the carried one's
        for req in map(Requirement, importlib.metadata.requires(dist) or []):
            if req.marker is not None and not req.marker.evaluate({"python_version": di.IMAGE_PYTHON, "extra": ""}):
                continue
            name = di.normalise(req.name)
            assert name in have, (dist, req)
            if same_version and name in carried:
                assert req.specifier.contains(carried[name]), (dist, req, carried[name])


def test_the_download_asks_for_the_images_python_and_every_carried_wheel() -> None:
    cmd = di.download_command("/tmp/w")
    assert cmd[cmd.index("--python-version") + 1] == "3.12" and "--no-deps" in cmd
    assert {f"{k}=={v}" for k, v in di.CARRIED.items()} <= set(cmd)
    run = di.device_command("abc1234")
    assert run.startswith(di.INSTALL) and "NTKM_GIT_COMMIT=abc1234 python3 -m benchmarks.gpu_check" in run
    assert len(run) <= 2000  # the device tool's limit on a command line


def test_a_device_call_sends_less_than_the_tools_limit() -> None:
    size = di.travel_bytes()
    assert size["total"] == size["tracked"] + size["data"] + size["wheels"]
    assert size["total"] <= di.TRAVEL_LIMIT, {k: round(v / 2**20, 1) for k, v in size.items()}


def test_a_rehearsal_without_the_images_python_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    rc = di.main(["rehearse", "--python", str(tmp_path / "no-python3.12"), "--venv", str(tmp_path / "venv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--python" in err[0] and not (tmp_path / "venv").exists()
