"""A clean install prints no warning, and a built wheel ships the files the gateway serves
(issue 42: `pip install -e .` printed setuptools' 40-line warning that `pep.http.console`, the
console's static files, was a package absent from the configuration, and its warning about an
editable install of a layout it could not tell).

The pip of the project's environment (recent enough to show a build backend's warnings) works
on a copy of the sources, so that nothing is built inside the checkout: an editable install
into a fresh virtual environment, and a wheel (the build back end fetched as for any install:
pip's cache or the package index)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "pdp", "pep", "proxy", "server", "common")
SHIPPED = ("pep/http/console/index.html", "pep/http/console/app.js",
           "pep/http/console/console.css", "pep/http/console/favicon.svg",
           "pep/runtime/log4j2.properties")

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("xsg-sources")
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, copy / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, copy / name)
    return copy


def pip(*args: str) -> subprocess.CompletedProcess:
    run = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check",
                          "--retries", "1", "--timeout", "30", *args],
                         capture_output=True, text=True, timeout=200)
    assert run.returncode == 0, run.stdout + run.stderr
    return run


def warnings_in(run: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (run.stdout + run.stderr).splitlines()
            if "warning" in line.lower()]


def test_an_editable_install_into_a_fresh_environment_prints_no_warning(sources, tmp_path):
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    run = pip("--python", str(python), "install", "--no-deps", "-e", str(sources))
    assert "Successfully installed xsg" in run.stdout
    assert warnings_in(run) == [], run.stdout + run.stderr
    # the installed package is the sources' (not imported: --no-deps left Flask out)
    probe = subprocess.run([str(python), "-c", "import importlib.util, sys; sys.stdout.write("
                            "importlib.util.find_spec('pep').submodule_search_locations[0])"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    assert (Path(probe.stdout) / "http" / "console" / "index.html").samefile(
        sources / "pep" / "http" / "console" / "index.html")


def test_a_built_wheel_ships_the_console_and_the_log_settings(sources, tmp_path):
    run = pip("wheel", "--no-deps", "-w", str(tmp_path), str(sources))
    assert warnings_in(run) == [], run.stdout + run.stderr
    wheel = next(tmp_path.glob("xsg-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert set(SHIPPED) <= names, sorted(n for n in names if not n.endswith(".py"))
    assert "pep/http/console/__init__.py" in names
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    assert {n.split("/")[0] for n in names} == {"pdp", "pep", "proxy", "server", "common",
                                                dist_info}
