"""The layout holds: which package may import which, and the pure core stays pure.

The core is checked at run time (import every module of pep.core in a fresh interpreter and look
at what got loaded, so that indirect imports count too); the dependency rules between packages
are checked on the source (every import statement, including those inside functions).
"""
from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN_IN_CORE = ("flask", "werkzeug", "pyspark", "py4j", "sqlite3", "_sqlite3", "cheroot",
                     "requests")


def modules_of(package: str) -> list[str]:
    root = REPO / package.replace(".", "/")
    names = [package]
    for info in pkgutil.walk_packages([str(root)], prefix=package + "."):
        names.append(info.name)
    return names


def imports_in(path: Path) -> set[str]:
    """Every module named by an import statement in the file (absolute names)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def sources(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def test_the_core_loads_no_web_framework_spark_or_database():
    core = modules_of("pep.core")
    assert "pep.core.access" in core and "pep.core.merge" in core
    code = ("import importlib, json, sys\n"
            f"for name in {core!r}:\n"
            "    importlib.import_module(name)\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout))
    bad = sorted(m for m in loaded if m.split(".")[0] in FORBIDDEN_IN_CORE)
    assert bad == [], f"pep.core loads {bad}"
    assert not any(m.startswith(("pep.http", "pep.runtime", "pep.handles", "pep.streams"))
                   for m in loaded)


@pytest.mark.parametrize("package, may_not", [
    ("pdp", ("pep", "proxy")),
    ("pep", ("proxy",)),
])
def test_lower_packages_do_not_import_higher_ones(package, may_not):
    for path in sources(package):
        for name in imports_in(path):
            assert name.split(".")[0] not in may_not, f"{path.relative_to(REPO)} imports {name}"


def test_the_proxy_uses_only_the_invalidation_protocol_and_the_server_of_pep():
    # the server (pep.http.serving) and the pieces of it a native route uses
    allowed = {"pep.invalidation.protocol", "pep.http.serving", "pep.http.bridge",
               "pep.http.streaming"}
    for path in sources("proxy"):
        for name in imports_in(path):
            if name.split(".")[0] == "pep":
                module = name if name in allowed else name.rsplit(".", 1)[0]
                assert module in allowed, f"{path.relative_to(REPO)} imports {name}"


def test_spark_is_imported_only_under_pep_runtime():
    for package in ("pdp", "pep", "proxy"):
        for path in sources(package):
            if path.is_relative_to(REPO / "pep" / "runtime"):
                continue
            for name in imports_in(path):
                assert name.split(".")[0] not in ("pyspark", "py4j"), \
                    f"{path.relative_to(REPO)} imports {name}"


def test_flask_stays_at_the_http_edges():
    edges = (REPO / "pdp" / "http", REPO / "pep" / "http", REPO / "proxy")
    for package in ("pdp", "pep"):
        for path in sources(package):
            if any(path.is_relative_to(edge) for edge in edges):
                continue
            for name in imports_in(path):
                assert name.split(".")[0] not in ("flask", "werkzeug"), \
                    f"{path.relative_to(REPO)} imports {name}"
