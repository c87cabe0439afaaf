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
PRODUCTION_PACKAGES = ("pdp", "pep", "proxy", "server", "common")
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


# Which package may import which, by top-level name. The arrows point down:
#   pep, proxy  ->  pdp (its public names only, below), server, common
#   pdp         ->  common
#   server, common  ->  nothing of the project
MAY_NOT_IMPORT = {
    "pdp": ("pep", "proxy", "server"),
    "pep": ("proxy",),
    "proxy": ("pep",),
    "server": ("pdp", "pep", "proxy", "common"),
    "common": ("pdp", "pep", "proxy", "server"),
}


@pytest.mark.parametrize("package, may_not", sorted(MAY_NOT_IMPORT.items()))
def test_lower_packages_do_not_import_higher_ones(package, may_not):
    for path in sources(package):
        for name in imports_in(path):
            assert name.split(".")[0] not in may_not, f"{path.relative_to(REPO)} imports {name}"


def test_the_server_knows_no_web_framework():
    """The HTTP server serves any WSGI app: no Flask in it (the common package has Flask only in
    common/http: `test_flask_stays_at_the_http_edges`)."""
    for path in sources("server"):
        for name in imports_in(path):
            assert name.split(".")[0] not in ("flask", "werkzeug"), \
                f"{path.relative_to(REPO)} imports {name}"


def pdp_import_faults(source: str, public: dict[str, set[str]]) -> list[str]:
    """What a module of pep/ or proxy/ imports of pdp/ beyond its public names: `from pdp
    import X` and `from pdp.http import X` with X in that package's `__all__` (`public`, by
    package), nothing else (no `import pdp...`, no other module of pdp)."""
    faults = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            faults += [f"line {node.lineno}: import {a.name}" for a in node.names
                       if a.name.split(".")[0] == "pdp"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "pdp":
            names = public.get(node.module)
            if names is None:
                faults.append(f"line {node.lineno}: from {node.module} import ...")
                continue
            faults += [f"line {node.lineno}: from {node.module} import {a.name} (not in "
                       f"{node.module}.__all__)" for a in node.names if a.name not in names]
    return faults


def _pdp_public() -> dict[str, set[str]]:
    import pdp
    import pdp.http
    public = {"pdp": set(pdp.__all__), "pdp.http": set(pdp.http.__all__)}
    for package, names in public.items():
        module = pdp if package == "pdp" else pdp.http
        missing = sorted(n for n in names if not hasattr(module, n))
        assert missing == [], f"{package}.__all__ names what it does not have: {missing}"
    return public


def test_the_stream_side_and_the_proxy_use_only_the_public_names_of_pdp():
    public = _pdp_public()
    faults = [f"{path.relative_to(REPO)} {fault}" for package in ("pep", "proxy")
              for path in sources(package)
              for fault in pdp_import_faults(path.read_text(encoding="utf-8"), public)]
    assert faults == [], "\n".join(faults)


def test_the_public_names_check_finds_what_it_must():
    public = {"pdp": {"PolicyEngine"}, "pdp.http": {"create_pdp_blueprint"}}
    assert pdp_import_faults("from pdp import PolicyEngine\n"
                             "from pdp.http import create_pdp_blueprint\n"
                             "from common.auth import Identity\n", public) == []
    assert len(pdp_import_faults("from pdp.engine import PolicyEngine\n", public)) == 1
    assert len(pdp_import_faults("from pdp import PolicyEngine, compile_policy\n", public)) == 1
    assert len(pdp_import_faults("def f():\n    from pdp.http.api import decide_as\n",
                                 public)) == 1
    assert len(pdp_import_faults("import pdp.store\n", public)) == 1


def test_spark_is_imported_only_under_pep_runtime():
    for package in PRODUCTION_PACKAGES:
        for path in sources(package):
            if path.is_relative_to(REPO / "pep" / "runtime"):
                continue
            for name in imports_in(path):
                assert name.split(".")[0] not in ("pyspark", "py4j"), \
                    f"{path.relative_to(REPO)} imports {name}"


# The runtime's rooms (pep/runtime/README.md), bottom up: each imports only the rooms below it,
# and none the modules at the top (the runtime facade, the lazy runtime, the session). So the
# shared query's parts can use windows and plans, never the other way round.
RUNTIME_ROOMS = {
    "base": (),
    "privacy": (),
    "plans": ("base", "privacy"),
    "windows": ("base", "plans"),
    "sources": ("base",),
    "delivery": ("base",),
    "joins": ("base", "privacy", "plans", "sources"),
    "query": ("base", "privacy", "plans", "windows", "sources", "delivery"),
    "shared": ("base", "privacy", "plans", "windows", "sources", "query"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_each_runtime_room_imports_only_the_rooms_below_it():
    runtime = REPO / "pep" / "runtime"
    rooms = {p.name for p in runtime.iterdir() if (p / "__init__.py").is_file()}
    assert rooms == set(RUNTIME_ROOMS), "a new room of pep/runtime says which rooms it uses"
    for room, below in RUNTIME_ROOMS.items():
        for path in sources(f"pep/runtime/{room}"):
            for name in imports_in(path):
                parts = name.split(".")
                if parts[:2] == ["pep", "runtime"] and len(parts) > 2 and parts[2] != room:
                    assert parts[2] in below, f"{path.relative_to(REPO)} imports {name}"


def test_the_runtime_has_no_import_cycle():
    """Every import of pep/runtime (those inside functions too) reads top-down."""
    graph = {_module_name(p): set() for p in sources("pep/runtime")}
    for path in sources("pep/runtime"):
        module = _module_name(path)
        graph[module] = {n for n in imports_in(path) if n in graph and n != module}
    done: set[str] = set()

    def visit(module: str, trail: tuple[str, ...]) -> None:
        assert module not in trail, f"import cycle: {' -> '.join(trail + (module,))}"
        if module not in done:
            for other in sorted(graph[module]):
                visit(other, trail + (module,))
            done.add(module)

    for module in sorted(graph):
        visit(module, ())


def test_windows_on_the_driver_load_no_spark():
    """The driver's window arithmetic and the compiled plans are numpy and Python: they run
    (and are tested) without a JVM."""
    modules = [*modules_of("pep.runtime.windows"), "pep.runtime.plans.compile"]
    code = ("import importlib, json, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout))
    assert "pep.runtime.windows.pane_windows" in loaded
    assert not any(m.split(".")[0] in ("pyspark", "py4j") for m in loaded)


def test_flask_stays_at_the_http_edges():
    edges = (REPO / "pdp" / "http", REPO / "pep" / "http", REPO / "proxy", REPO / "common" / "http")
    for package in ("pdp", "pep", "common"):
        for path in sources(package):
            if any(path.is_relative_to(edge) for edge in edges):
                continue
            for name in imports_in(path):
                assert name.split(".")[0] not in ("flask", "werkzeug"), \
                    f"{path.relative_to(REPO)} imports {name}"


# ----- composition, not inheritance -----------------------------------------------------------
# A production class inherits at most one level of project classes (its own plus one base: a
# chain of two), and, counted with the project classes it inherits from, stays under about 600
# lines: a big object is a few parts that own their state and are handed to each other, not a
# stack of classes sharing `self`. Exceptions are left out: a hierarchy of kinds of error is
# what they are for.
MAX_CHAIN = 2
MAX_CLASS_LINES = 600


def _project_classes() -> dict[str, tuple[list[str], int]]:
    """Every top-level class of the production packages: its project bases (by their
    qualified names, as the module imports them) and its length in lines."""
    classes: dict[str, tuple[list[str], int]] = {}
    for package in PRODUCTION_PACKAGES:
        for path in sources(package):
            parts = path.relative_to(REPO).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            imported = {alias.asname or alias.name: f"{node.module}.{alias.name}"
                        for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                        and node.module and node.level == 0 for alias in node.names}
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    bases = [_qualified(ast.unparse(b), module, imported) for b in node.bases]
                    classes[f"{module}.{node.name}"] = (
                        bases, (node.end_lineno or node.lineno) - node.lineno + 1)
    return classes


def _qualified(name: str, module: str, imported: dict[str, str]) -> str:
    """A base class's qualified name: through the module's imports (`Base`, `module.Base`),
    else a class of the module itself."""
    head, dot, rest = name.partition(".")
    if head in imported:
        return imported[head] + dot + rest
    return f"{module}.{name}"


def _is_exception(name: str, classes: dict[str, tuple[list[str], int]]) -> bool:
    bases = classes[name][0]
    return any(b.rsplit(".", 1)[-1] in ("Exception", "BaseException", "Warning")
               or (b in classes and _is_exception(b, classes)) for b in bases)


def test_no_class_chain_deeper_than_two_and_none_too_big():
    classes = _project_classes()

    def chain(name: str) -> int:
        return 1 + max((chain(b) for b in classes[name][0] if b in classes), default=0)

    def lines(name: str) -> int:
        return classes[name][1] + sum(lines(b) for b in classes[name][0] if b in classes)

    deep = sorted(n for n in classes if not _is_exception(n, classes) and chain(n) > MAX_CHAIN)
    assert deep == [], f"class chains deeper than {MAX_CHAIN}: {deep}"
    big = sorted(f"{n} ({lines(n)} lines)" for n in classes if lines(n) > MAX_CLASS_LINES)
    assert big == [], f"classes over {MAX_CLASS_LINES} lines with their bases: {big}"
