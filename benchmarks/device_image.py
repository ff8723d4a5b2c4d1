"""What the lent GPU machine's Python holds, the wheels the device check carries for the rest, and the command.

The device machine runs its own image ('cuda': Python 3.12, torch 2.11 + CUDA 13; the package list below as the
device tool's list of kinds read it on 2026-11-17) and can fetch nothing. The suite's core needs pydantic (the typed
records), which that image lacks: a device check started without it loses its `environment` and `audit` sections
(seen in a CPU run with the device's packages alone, 2026-12-07), so the check carries pydantic and what it needs
as wheels for the image's Python (`CARRIED`), as the device tool's README prescribes, and refuses to start without
them (`missing_carried`). The optional extras (weasyprint, ray, kronfluence, traker) are not carried: the check
runs with `--no-pdf` and without the library peers.

    python -m benchmarks.device_image prepare    # .whl/ and ./data filled, the size checked, the run printed
    python -m benchmarks.device_image wheels     # only download CARRIED into .whl/ (here, where PyPI is reachable)
    python -m benchmarks.device_image command    # only print the device check's command line
    python -m benchmarks.device_image rehearse   # the smoke device check in a venv of the image's Python,
                                                 # torch and numpy (a CPU build of nothing: ~5 GB from PyPI)

What travels to the device is the checkout's tracked and untracked-not-ignored files plus the carried paths, at
most 64 MiB (`TRAVEL_LIMIT`): the full MNIST and CIFAR-10 files (`./data`, 31 MB) and the wheels (2.6 MB) leave
about 30 MiB for the tracked files, which a CI test holds (`travel_bytes`).

`allowed_modules()` names every top-level module a process on the device image can import (the standard library,
this repository's packages, and the modules of the image's and the carried distributions installed here);
`blocked_modules()` the rest of what is installed here. The CI runs the device check's smoke run with those absent
(`device_image_env`), so a new dependency that the image lacks fails on the CPU, not in a lent session.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import _git_commit

ROOT = Path(__file__).resolve().parents[1]
IMAGE_READ = "2026-11-17"
IMAGE_PYTHON = "3.12"
WHEEL_DIR = ".whl"
DATA_DIR = "data"
TRAVEL_LIMIT = 64 * 2**20  # the device tool's limit on what one call sends
# Sizes as carried on 2026-12-07: ../shared/data (MNIST's four IDX .gz, CIFAR-10's JPEG .tar.gz, README) and the
# CARRIED wheels; `travel_bytes` uses the real ones where they are present.
DATA_BYTES = 31_137_274
WHEELS_BYTES = 2_640_603
SITE_DIR = ROOT / "benchmarks" / "device_site"
BLOCK_ENV = "NTKM_DEVICE_BLOCK"

# The 'cuda' image's distributions (the device tool's "Python packages already there", read on IMAGE_READ).
IMAGE_DISTRIBUTIONS: frozenset[str] = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
""".split())

# Carried as wheels for the image's Python: pydantic and its requirements (its METADATA's Requires-Dist), at the
# versions this suite is tested with. typing-extensions is on the image, but at a version not recorded there, and
# pydantic-core needs >= 4.14.1: the carried one shadows it (pure Python; torch accepts newer ones).
CARRIED: dict[str, str] = {
    "pydantic": "2.13.4",
    "pydantic-core": "2.46.4",
    "annotated-types": "0.7.0",
    "typing-inspection": "0.4.2",
    "typing-extensions": "4.16.0",
}

# The image's versions where its list records them (the device tool's pip list, 2026-11), for `rehearse`; the
# suite's other needs there unpinned (the image's versions are not recorded).
IMAGE_PINS: dict[str, str] = {"torch": "2.11.0", "numpy": "2.5.2"}
REHEARSAL_NEEDS = ("scipy", "sympy", "mpmath", "jinja2", "matplotlib", "pillow", "safetensors", "statsmodels")

# This repository's own top-level packages (run from the checkout on the device, not installed).
REPO_PACKAGES = frozenset({"ntkm", "theory", "empirics", "verify", "reports", "benchmarks"})

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def normalise(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def device_distributions() -> frozenset[str]:
    """Every distribution a process on the device can import from: the image's and the carried ones."""
    return frozenset(normalise(d) for d in IMAGE_DISTRIBUTIONS | set(CARRIED))


def allowed_modules() -> frozenset[str]:
    """The top-level modules importable on the device image, as far as this machine's installs can tell."""
    allowed = device_distributions()
    names = set(sys.stdlib_module_names) | set(REPO_PACKAGES)
    for module, dists in importlib.metadata.packages_distributions().items():
        if any(normalise(d) in allowed for d in dists):
            names.add(module)
    return frozenset(names)


def blocked_modules() -> frozenset[str]:
    """The top-level modules installed here that the device image lacks (private `_` helpers aside)."""
    import pkgutil

    here = {m.name for m in pkgutil.iter_modules()} | set(importlib.metadata.packages_distributions())
    allowed = allowed_modules()
    return frozenset(m for m in here if m not in allowed and not m.startswith("_") and m.isidentifier()
                     and not (ROOT / m).exists())  # the checkout's own folders (tests/) travel with it


def device_image_env() -> dict[str, str]:
    """Environment variables that make a Python process, and those it starts, see the device image's packages:
    `benchmarks/device_site/sitecustomize.py` marks every blocked module absent (None in `sys.modules`, so an
    import fails and `importlib.util.find_spec` says absent, as on the device)."""
    path = os.pathsep.join(filter(None, [str(SITE_DIR), os.environ.get("PYTHONPATH", "")]))
    return {"PYTHONPATH": path, BLOCK_ENV: ",".join(sorted(blocked_modules()))}


def missing_carried() -> list[str]:
    """The carried distributions this interpreter cannot import (checked by their import name, as the check will)."""
    import importlib.util

    return [dist for dist in CARRIED if importlib.util.find_spec(normalise(dist).replace("-", "_")) is None]


def download_command(dest: str = WHEEL_DIR) -> list[str]:
    """pip's command that fetches the carried wheels for the image's Python and platform (needs PyPI)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
           IMAGE_PYTHON, "--implementation", "cp"]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    return [*cmd, "-d", dest, *(f"{name}=={version}" for name, version in CARRIED.items())]


INSTALL = ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "
           f"{WHEEL_DIR}/*.whl && export PYTHONPATH=/tmp/site || exit;")
SECTIONS = "environment,primitives,quick,refit_stack,audit,agreement,engine,gpu_preset"


def device_command(commit: str, budget_s: int = 420) -> str:
    """The one command a lent session runs (carry `data` and `.whl`): install the wheels, then the device check."""
    return (f"{INSTALL} NTKM_GIT_COMMIT={commit} python3 -m benchmarks.gpu_check --budget-s {budget_s} "
            f"--sections {SECTIONS} --unpack results/gpu-check-state.tar.gz --pack $OUT/gpu-check-state.tar.gz "
            "--json $OUT/gpu-check.json")


def _tree_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def tracked_bytes() -> int:
    """Bytes of the checkout's tracked and untracked-not-ignored files (what every device call sends)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout
    return sum((ROOT / name).stat().st_size for name in out.decode().split("\0") if name and (ROOT / name).is_file())


def travel_bytes() -> dict[str, int]:
    """What the device call of `device_command` sends, by part (recorded sizes where ./data or .whl is absent)."""
    data, wheels = ROOT / DATA_DIR, ROOT / WHEEL_DIR
    parts = {"tracked": tracked_bytes(),
             "data": _tree_bytes(data) if data.is_dir() else DATA_BYTES,
             "wheels": _tree_bytes(wheels) if wheels.is_dir() else WHEELS_BYTES}
    return {**parts, "total": sum(parts.values()), "limit": TRAVEL_LIMIT}


def find_python(python: str | None) -> str | None:
    """An interpreter of the image's Python version: `python` if given, else `pythonX.Y` on PATH that runs (a pyenv
    shim may not), else pyenv's install of that version."""
    pyenv = sorted(map(str, Path.home().glob(f".pyenv/versions/{IMAGE_PYTHON}.*/bin/python3")))
    found = [python] if python else [f"python{IMAGE_PYTHON}", *pyenv]
    for exe in found:
        try:
            out = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == IMAGE_PYTHON:
            return exe
    return None


def rehearse(python: str | None, venv: Path, state: Path) -> int:
    """The smoke device check on this CPU in a venv of the image's Python with its torch and numpy and the carried
    wheels' versions, so that an incompatibility shows here before a lent session (the device's CUDA aside)."""
    exe = venv / "bin" / "python"
    if not exe.is_file():
        base = find_python(python)
        if base is None:
            print(f"benchmarks.device_image: error: no Python {IMAGE_PYTHON} found ({python or 'PATH, ~/.pyenv'}); "
                  "pass --python PATH", file=sys.stderr)
            return 2
        pins = [f"{k}=={v}" for k, v in {**IMAGE_PINS, **CARRIED}.items()]
        steps = (([base, "-m", "venv", str(venv)], f"{base} could not make a venv at {venv}"),
                 ([str(exe), "-m", "pip", "install", "-q", *pins, *REHEARSAL_NEEDS],
                  "pip could not install the image's versions; PyPI must be reachable"))
        for step, why in steps:
            if subprocess.run(step).returncode != 0:
                print(f"benchmarks.device_image: error: {why}", file=sys.stderr)
                shutil.rmtree(venv, ignore_errors=True)
                return 1
    return subprocess.run([str(exe), "-m", "benchmarks.gpu_check", "--device", "cpu", "--smoke", "--resume",
                           str(state)], cwd=ROOT).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.device_image", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    wheels = sub.add_parser("wheels", help=f"download the carried wheels into {WHEEL_DIR}/ (needs PyPI)")
    wheels.add_argument("--dest", default=str(ROOT / WHEEL_DIR))
    command = sub.add_parser("command", help="print the lent session's device command (carry data and .whl)")
    prepare = sub.add_parser("prepare", help="download the wheels, copy the data into ./data, check the size, "
                             "print the run's command and carry list")
    prepare.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"),
                         help="the full data sets to carry (default: ../shared/data)")
    for p in (command, prepare):
        p.add_argument("--budget-s", type=int, default=420)
    rehearsal = sub.add_parser("rehearse", help=f"the smoke device check in a venv of Python {IMAGE_PYTHON} with "
                               "the image's torch and numpy (downloads ~5 GB the first time)")
    rehearsal.add_argument("--python", default=None, help=f"a Python {IMAGE_PYTHON} interpreter (default: "
                           f"python{IMAGE_PYTHON} on PATH, else pyenv's)")
    rehearsal.add_argument("--venv", default="/tmp/ntkm-device-venv")
    rehearsal.add_argument("--resume", default="runs/device-rehearsal", help="the check's state folder")
    args = ap.parse_args(argv)
    if args.verb == "rehearse":
        return rehearse(args.python, Path(args.venv), Path(args.resume))
    if args.verb in ("wheels", "prepare"):
        dest = getattr(args, "dest", str(ROOT / WHEEL_DIR))
        if subprocess.run(download_command(dest)).returncode != 0:
            print("benchmarks.device_image: error: pip could not download the wheels; PyPI must be reachable here",
                  file=sys.stderr)
            return 1
    if args.verb == "prepare":
        src, data = Path(args.data_dir), ROOT / DATA_DIR
        if not data.exists():
            if not src.is_dir():
                print(f"benchmarks.device_image: error: no data folder {src}; pass --data-dir with the full MNIST "
                      "and CIFAR-10 files", file=sys.stderr)
                return 2
            shutil.copytree(src, data)
        size = travel_bytes()
        mib = {k: v / 2**20 for k, v in size.items()}
        print(f"travels: {mib['total']:.1f} MiB of {mib['limit']:.0f} (tracked {mib['tracked']:.1f}, data "
              f"{mib['data']:.1f}, wheels {mib['wheels']:.1f})")
        if size["total"] > TRAVEL_LIMIT:
            print("benchmarks.device_image: error: the device call would send more than 64 MiB; shrink the tracked "
                  "files (gzip large records in results/)", file=sys.stderr)
            return 1
        print(f"carry: [\"{DATA_DIR}\", \"{WHEEL_DIR}\"]")
    if args.verb in ("command", "prepare"):
        print(device_command(_git_commit() or "unknown", args.budget_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
