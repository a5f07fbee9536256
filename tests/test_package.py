"""mclib as an installed package: its profiles and tables found through importlib.resources,
the `mclib` command and `mclib.__version__`, the public names of `mclib`, pyproject.toml's
ranges against requirements.lock, and (slow) a wheel installed outside the checkout that trains."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
from pathlib import Path

import pytest

import mclib
from mclib.__main__ import main
from mclib.core import packaged, repo
from mclib.core.config import load_profile, profile_path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lockfile():
    spec = importlib.util.spec_from_file_location("lockfile", ROOT / "scripts" / "lockfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lockfile = _lockfile()


# --- fast: package data ------------------------------------------------------------------


def test_a_profile_name_is_the_shipped_file_which_in_the_checkout_is_params():
    assert profile_path("cpu") == ROOT / "params" / "cpu.yaml"
    assert (ROOT / "mclib" / "profiles").resolve() == ROOT / "params"
    assert packaged.profile_names() == sorted(p.stem for p in (ROOT / "params").glob("*.yaml"))
    assert load_profile(profile_path("smoke")).name == "smoke"
    assert profile_path("some/file.yaml") == Path("some/file.yaml")  # a path stays a path


def test_the_shipped_tables_are_pyprojects_package_data_and_docs_data():
    shipped = PYPROJECT["tool"]["setuptools"]["package-data"]["mclib"]
    assert sorted(f.removeprefix("data/") for f in shipped if f.startswith("data/")) == sorted(
        packaged.DATA_FILES
    )
    assert "profiles/*.yaml" in shipped
    for name in packaged.DATA_FILES:
        assert (
            packaged.data_file(name) == ROOT / "docs" / "data" / name and packaged.data_file(name).is_file()
        )
    with pytest.raises(ValueError, match="'cpu_sweep.csv' is not one of mclib's data files"):
        packaged.data_file("cpu_sweep.csv")


def test_what_needs_the_checkout_says_so_in_one_line_where_there_is_none(monkeypatch, tmp_path, capsys):
    assert repo.is_checkout()
    monkeypatch.setattr(repo, "REPO", tmp_path)  # as an installed wheel's site-packages: no _toc.yml
    assert not repo.is_checkout()
    for argv in (["book", "--profile", "smoke"], ["slice", "status"], ["solvers", "--profile", "smoke"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "needs a source checkout of mclib" in err, err


# --- fast: the command and the names ---------------------------------------------------


def test_version_is_pyprojects_and_the_command_prints_it(capsys):
    assert mclib.__version__ == PYPROJECT["project"]["version"]
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"mclib {mclib.__version__}"
    assert PYPROJECT["project"]["scripts"]["mclib"] == "mclib.__main__:main"


def test_import_mclib_is_cheap_and_its_names_are_the_modules_own():
    # the names load their modules when first used (most need torch); the package and its version do not
    code = (
        "import sys, mclib; v = mclib.__version__; print('torch' in sys.modules); "
        "mclib.evaluate; print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["False", "True"]
    import importlib

    for name, module in mclib._API.items():
        assert getattr(mclib, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        mclib.nothing


def test_the_readmes_python_example_imports_only_public_names():
    # every `mclib` name README's examples call is one `mclib` exports
    readme = (ROOT / "README.md").read_text()
    used = {
        n for m in re.finditer(r"from mclib\.[\w.]+ import ([\w, ]+)", readme) for n in m.group(1).split(", ")
    }
    used |= set(re.findall(r"`(nnsight_model|load_for_interp|run_with_cache|hooks)\(", readme))
    assert used and used <= set(mclib.__all__), used - set(mclib.__all__)


# --- fast: ranges and the lockfile -------------------------------------------------------


def test_the_lockfile_pins_every_dependency_inside_pyprojects_range():
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith(("#", "--")):
            name, version = line.split("==")
            pins[lockfile.canonicalize_name(name)] = version
    for req in lockfile.roots(ROOT / "pyproject.toml", ["test"]):
        name = lockfile.canonicalize_name(req.name)
        assert name in pins, f"{req} is not in requirements.lock"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock: {name}=={pins[name]} outside {req}"
        )
    assert pins["jupyter-book"] == "1.0.4.post1" and pins["papermill"] == "2.7.0"


def test_the_lockfile_script_names_a_missing_or_out_of_range_package(tmp_path):
    bad = tmp_path / "pyproject.toml"
    bad.write_text('[project]\nname = "x"\ndependencies = ["no-such-package-mclib", "pyyaml"]\n')
    with pytest.raises(lockfile.LockError, match="no-such-package-mclib is not installed"):
        lockfile.closure(lockfile.roots(bad, []))
    bad.write_text('[project]\nname = "x"\ndependencies = ["pyyaml<1"]\n')
    with pytest.raises(lockfile.LockError, match=r"pyyaml \S+ in .* is outside pyyaml<1"):
        lockfile.closure(lockfile.roots(bad, []))
    with pytest.raises(lockfile.LockError, match="--extras 'nope'"):
        lockfile.roots(bad, ["nope"])


# --- slow: a wheel, installed outside the checkout ---------------------------------------


def _copy_source(dest: Path) -> Path:
    """What a build reads, copied with its links (mclib/profiles -> ../params, mclib/data ->
    ../docs/data), so that the checkout gets no build/ or egg-info."""
    import shutil

    src = dest / "src"
    shutil.copytree(
        ROOT / "mclib", src / "mclib", symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(ROOT / "params", src / "params")
    shutil.copytree(ROOT / "docs" / "data", src / "docs" / "data")
    shutil.copy2(ROOT / "pyproject.toml", src)
    return src


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, (
        f"{cmd}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.mark.slow
def test_an_installed_wheel_trains_outside_the_checkout(tmp_path):
    """The wheel is built as `python -m build` builds one (an sdist, then the wheel from the
    unpacked sdist: the links must come through as files), without build isolation (setuptools
    from this environment; no download). It is installed with `pip install --no-deps` into a
    fresh venv that sees this environment's packages through a .pth line: reinstalling torch,
    transformers, cvxpy and jupyter-book (~1 GB) would take minutes and test pip, not mclib.
    `--system-site-packages` would not do: it shows the base interpreter's packages, not this
    venv's. What --no-deps skips is checked instead: each of the wheel's Requires-Dist is
    installed in a version its range accepts. The .pth adds the folder to sys.path without
    processing its own .pth files, so an editable install of mclib there stays out of sight;
    the test checks that mclib is imported from the new venv. Then, from a folder outside the
    checkout, `mclib --version`, a smoke run trained (its folder has metrics), and `mclib book`
    refused in one line (the book's notebooks are the checkout's)."""
    pytest.importorskip("setuptools.build_meta")  # the build backend, used here without isolation

    src = _copy_source(tmp_path)
    dist = tmp_path / "dist"
    _run(
        [sys.executable, "-c", f"from setuptools import build_meta as b; b.build_sdist({str(dist)!r})"],
        cwd=src,
    )
    (sdist,) = dist.glob("mclib-*.tar.gz")
    with tarfile.open(sdist) as tar:
        assert not [m.name for m in tar.getmembers() if m.issym()], "the sdist holds links"
        tar.extractall(tmp_path / "unpacked", filter="data")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            dist,
            unpacked,
        ]
    )
    (wheel,) = dist.glob("mclib-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    py = venv / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    here = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "zz-host-packages.pth").write_text("".join(f"{p}\n" for p in here))
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", wheel])

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"MPLBACKEND": "Agg"}
    mclib_cmd = venv / "bin" / "mclib"
    where = _run(
        [
            py,
            "-c",
            "import mclib, mclib.core.repo as r; print(mclib.__file__); print(mclib.profile_path('cpu')); "
            "print(r.is_checkout())",
        ],
        cwd=elsewhere,
        env=env,
    ).stdout.split()
    assert where[0].startswith(str(site)) and where[1].startswith(str(site)) and where[2] == "False", where
    assert Path(where[1]).is_file()
    deps = (
        "import importlib.metadata as m\ntry:\n from packaging.requirements import Requirement\n"
        "except ImportError:\n from pip._vendor.packaging.requirements import Requirement\n"
        "for line in m.requires('mclib'):\n r = Requirement(line)\n"
        " if r.marker and not r.marker.evaluate({'extra': ''}): continue\n"
        " v = m.version(r.name)\n assert r.specifier.contains(v, prereleases=True), (str(r), v)\nprint('ok')"
    )
    assert _run([py, "-c", deps], cwd=elsewhere, env=env).stdout.strip() == "ok"

    assert (
        _run([mclib_cmd, "--version"], cwd=elsewhere, env=env).stdout.strip()
        == f"mclib {PYPROJECT['project']['version']}"
    )
    flag = (
        "--profile"
        if "--profile" in _run([mclib_cmd, "train", "--help"], cwd=elsewhere, env=env).stdout
        else "--params"
    )
    _run(
        [mclib_cmd, "train", flag, "smoke", "--out", "runs/smoke", "--quiet"],
        cwd=elsewhere,
        env=env,
        timeout=600,
    )
    from mclib.core.runs import METRICS, load_metrics

    metrics = load_metrics(elsewhere / "runs" / "smoke")
    assert (elsewhere / "runs" / "smoke" / METRICS).is_file() and int(metrics.step.iloc[-1]) == 60

    book = subprocess.run(
        [str(mclib_cmd), "book", "--profile", "smoke"], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert (
        book.returncode == 2 and book.stderr.count("\n") == 1 and "needs a source checkout" in book.stderr
    ), book.stderr
    assert not (elsewhere / "runs" / "smoke-seed1").exists()
