"""scripts/wheelhouse.py: the wheels that install mclib on an offline node that has its own torch.

The slow test plays the node on this machine: a new venv holding only torch (the CPU file pip
finds here, standing in for the node's CUDA build), a wheelhouse built for this machine's Python
and platform from that venv's `pip list`, then `pip install --no-index --find-links WHEELHOUSE -e
REPO` with every pip setting of this machine switched off (no index, no /opt/wheels), and the
imports. REPO is a copy of pyproject.toml and mclib/, so the checkout is left untouched.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "wheelhouse.py"


def _load():
    spec = importlib.util.spec_from_file_location("wheelhouse", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wheelhouse = _load()


# --- fast: the script's parts -----------------------------------------------------------


def test_a_manylinux_target_takes_every_older_manylinux_wheel():
    tags = wheelhouse.platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and tags[-1] == "manylinux1_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags
    assert wheelhouse.platform_tags("manylinux2014_x86_64")[0] == "manylinux_2_17_x86_64"
    assert wheelhouse.platform_tags("musllinux_1_2_aarch64") == [
        "musllinux_1_2_aarch64",
        "musllinux_1_1_aarch64",
    ]


def test_the_shipped_list_is_a_cuda_pytorch_image():
    have = wheelhouse.read_have(wheelhouse.DEFAULT_HAVE)
    assert have["torch"] == "2.11.0+cu130" and have["transformers"] == "5.17.0" and have["numpy"] == "2.5.2"
    assert (
        "papermill" not in have and "cvxpy" not in have and "dask" not in have and "jupyter-book" not in have
    )


def test_pyproject_lets_the_image_keep_its_torch_and_transformers():
    deps, build = wheelhouse.project_requirements(ROOT / "pyproject.toml")
    wheelhouse.check_node_versions(deps, wheelhouse.read_have(wheelhouse.DEFAULT_HAVE))  # no error
    torch = next(r for r in deps if r.name == "torch")
    # a fresh CPU install still takes 2.13.0 (the highest in range; +cpu is the file on disk)
    assert torch.specifier.contains("2.13.0+cpu") and not torch.specifier.contains("2.13.1")
    assert not torch.specifier.contains("2.14.1")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--platform", "linux_foo"], "unknown platform 'linux_foo'"),
        (["--platform", "manylinux_2_28_sparc"], "unknown platform 'manylinux_2_28_sparc'"),
        (["--python", "3"], "unknown Python version '3'"),
        (["--have", "/nonexistent/have.txt"], "--have file not found: /nonexistent/have.txt"),
    ],
)
def test_bad_input_is_one_line_naming_the_value(argv, message, tmp_path, capsys):
    assert wheelhouse.main([*argv, "--out", str(tmp_path / "wh")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize(
    "have, message",
    [
        ("torch==2.11.0+cu130\ntransformers==4.57.6\n", "the node's transformers 4.57.6 does not satisfy"),
        ("torch==2.9.1\n", "the node's torch 2.9.1 does not satisfy"),
        ("numpy==2.5.2\n", "the node's list names no torch"),
        ("numpy==two\n", "not a version: 'two'"),
    ],
)
def test_a_node_mclib_cannot_use_is_named_before_pip_runs(have, message, tmp_path, capsys):
    (tmp_path / "have.txt").write_text(have)
    assert wheelhouse.main(["--have", str(tmp_path / "have.txt"), "--out", str(tmp_path / "wh")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


# --- slow: a wheelhouse for this machine, installed offline ------------------------------


def _pypi_reachable() -> bool:
    try:
        urllib.request.urlopen(
            urllib.request.Request("https://pypi.org/simple/pip/", method="HEAD"), timeout=5
        )
        return True
    except OSError:
        return False


def _native_platform() -> str | None:
    """This machine's newest manylinux tag (manylinux_2_36_x86_64 on Debian 12), or None."""
    from packaging.tags import sys_tags

    return next((t.platform for t in sys_tags() if t.platform.startswith("manylinux_")), None)


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_the_wheelhouse_installs_mclib_beside_the_nodes_own_torch(tmp_path):
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable: building a wheelhouse needs the network")
    platform = _native_platform()
    if platform is None:
        pytest.skip("this machine has no manylinux platform tag")
    start = time.monotonic()

    # The node: a venv with torch and what torch needs, nothing else.
    node = tmp_path / "node"
    _run([sys.executable, "-m", "venv", node])
    py = node / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q", "torch==2.13.0"])  # the local CPU file (env notes)
    have = tmp_path / "have.txt"
    have.write_text(_run([py, "-m", "pip", "list", "--format=freeze"]).stdout)
    torch_before = _run([py, "-c", "import torch; print(torch.__version__)"]).stdout.strip()

    # The wheelhouse, built here as on a connected machine (with this machine's pip settings).
    wh = tmp_path / "wheelhouse"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    built = _run(
        [
            sys.executable,
            SCRIPT,
            "--python",
            python,
            "--platform",
            platform,
            "--have",
            have,
            "--out",
            wh,
            "--max-mib",
            "1024",
        ]
    )
    assert "total:" in built.stdout
    names = {wheelhouse.parse_wheel_filename(w.name)[0] for w in wh.glob("*.whl")}
    assert {"papermill", "cvxpy", "distributed", "jupyter-book", "transformers", "setuptools"} <= names
    assert not names & {"torch", "triton", "sympy", "filelock"}, "the node's own packages were shipped"
    assert not any(n.startswith("nvidia-") for n in names)
    reqs = (wh / "requirements.txt").read_text()
    assert "papermill==2.7.0" in reqs and "torch" not in reqs

    # The node's install: no index, none of this machine's pip settings (find-links, mirrors).
    offline = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    offline["PIP_CONFIG_FILE"] = os.devnull
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", repo)
    shutil.copytree(ROOT / "mclib", repo / "mclib", ignore=shutil.ignore_patterns("__pycache__"))
    install = [py, "-m", "pip", "install", "--no-index", "--no-cache-dir"]

    # A wheelhouse missing one wheel fails: the check below can fail.
    partial = tmp_path / "partial"
    shutil.copytree(wh, partial, ignore=shutil.ignore_patterns("papermill-*.whl"))
    proc = subprocess.run(
        [str(c) for c in [*install, "--dry-run", "--find-links", partial, "-e", repo]],
        capture_output=True,
        text=True,
        env=offline,
    )
    assert proc.returncode != 0 and "papermill" in proc.stdout + proc.stderr

    _run([*install, "-q", "--find-links", wh, "-e", repo], env=offline)
    out = _run(
        [
            py,
            "-c",
            "import mclib, papermill, cvxpy, distributed, torch; "
            "import mclib.analyses.attention, mclib.book.runner; print(torch.__version__)",
        ],
        env=offline,
        cwd=tmp_path,
    ).stdout
    assert out.strip() == torch_before, "the install replaced the node's torch"
    _run([py, "-m", "pip", "check"], env=offline)
    print(f"wheelhouse test: {len(names)} wheels, {time.monotonic() - start:.0f} s")


def test_the_kit_holds_every_distribution_the_chapters_glue_imports():
    """What a chapter on the GPU imports beyond the image (papermill, its kernel, and myst-nb's
    glue, whose `glue()` imports myst_nb.ext.glue only when called) is in scripts/wheelhouse-have.txt
    or in the kit's closure (KIT walked as --kit walks it, here over the installed metadata): the
    lease of 2026-11-26 lost its first chapter to docutils, which glue imports and the kit lacked."""
    import importlib.metadata as md

    from packaging.markers import default_environment
    from packaging.utils import canonicalize_name

    probe = (
        "import sys; before = set(sys.modules); import "
        "papermill, ipykernel; from myst_nb.ext.glue import glue; "
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} - {m.split('.')[0] for m in before})))"
    )
    modules = _run([sys.executable, "-c", probe]).stdout.split()
    owners = md.packages_distributions()
    needed = {canonicalize_name(d) for m in modules for d in owners.get(m, [])}
    assert {"docutils", "myst-nb", "papermill"} <= needed  # the probe saw the imports
    resolved = {}
    for dist in md.distributions():
        resolved[canonicalize_name(dist.metadata["Name"])] = {
            "version": dist.version,
            "requires_dist": dist.requires or [],
        }
    have = wheelhouse.read_have(ROOT / "scripts" / "wheelhouse-have.txt")
    kit, _ = wheelhouse.walk(
        [wheelhouse.Requirement(r) for r in wheelhouse.KIT],
        resolved,
        lambda n: n in have or wheelhouse.is_gpu_stack(n) or n in wheelhouse.KIT_OMIT,
        dict(default_environment()),
        wheelhouse.KIT_LEAVES,
    )
    missing = sorted(n for n in needed if n not in have and n not in kit and not wheelhouse.is_gpu_stack(n))
    assert not missing, f"the chapters import {missing} on the GPU, in neither the image nor the kit"


@pytest.mark.slow
def test_the_lease_kit_is_small_and_holds_what_the_chapters_import_on_the_gpu(tmp_path):
    """scripts/wheelhouse.py --kit (docs/gpu.md): papermill, its kernel and myst-nb's glue,
    without the site builder, the solver, the cluster, or what the kernel runs without;
    under KIT_MAX_MIB (the script fails above it); installed with --no-deps it imports."""
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable: building the kit needs the network")
    platform = _native_platform()
    if platform is None:
        pytest.skip("this machine has no manylinux platform tag")
    kit = tmp_path / "kit"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    built = _run([sys.executable, SCRIPT, "--kit", "--python", python, "--platform", platform, "--out", kit])
    assert "--no-deps" in built.stdout
    names = {wheelhouse.parse_wheel_filename(w.name)[0] for w in kit.glob("*.whl")}
    assert {"papermill", "ipykernel", "myst-nb", "nbclient", "nbformat", "jupyter-client"} <= names
    assert not names & {
        "jupyter-book",
        "sphinx",
        "cvxpy",
        "dask",
        "distributed",
        "debugpy",
        "jedi",
        "torch",
        "transformers",
        "pandas",
        "numpy",
    }
    assert sum(w.stat().st_size for w in kit.glob("*.whl")) <= wheelhouse.KIT_MAX_MIB * wheelhouse.MIB
    site = tmp_path / "site"
    t0 = time.monotonic()
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--target",
            site,
            *kit.glob("*.whl"),
        ]
    )
    print(f"the kit installs in {time.monotonic() - t0:.1f} s here (docs/gpu.md)")
    out = _run(
        [
            sys.executable,
            "-c",
            "import papermill, ipykernel, myst_nb; from myst_nb.ext.glue import glue; "
            "print(papermill.__file__)",
        ],
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert out.stdout.startswith(str(site))
