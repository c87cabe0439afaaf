"""The documentation (issue 42): the site builds with no broken link and no page outside the
navigation, the README stays short and its walkthrough is the quick start's tested steps, and the
files the pages show are what the code makes of them."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from pep.core.rules.model import rule_from_json
from pep.core.rules.xacml import rule_to_xacml

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: a broken link, a missing anchor, a snippet naming a file that
    does not exist or a page the navigation does not reach fails the build."""
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                        str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True,
                       timeout=240, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin",
                                         "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    site = tmp_path / "site"
    assert (site / "quickstart.html").exists() and (site / "benchmarks.html").exists()
    # the OpenAPI document is in the site, generated from the app, with Swagger UI to show it
    doc = json.loads((site / "api" / "openapi.json").read_text())
    assert "/requests" in doc["paths"] and "/pdp" in doc["paths"]
    assert "swagger-ui" in (site / "api" / "openapi.html").read_text()
    # the walkthroughs' snippets were included, not left as markers
    page = (site / "quickstart.html").read_text()
    assert "--8&lt;--" not in page and "station2.json" in page and "avg_rainrate" in page


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text().replace("!!", "#"))

    def pages(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for v in node.values():
                yield from pages(v)
        elif isinstance(node, list):
            for v in node:
                yield from pages(v)

    in_nav = set(pages(config["nav"]))
    on_disk = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert on_disk == in_nav


def test_the_readme_is_short_and_its_walkthrough_is_the_tested_quick_start():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    block = text.split("<!-- walkthrough: examples/quickstart", 1)[1].split("```sh\n", 1)[1]
    lines = block.split("```", 1)[0].rstrip("\n").split("\n")
    assert lines[0].startswith(". .venv/bin/activate && eval \"$(examples/env.sh)\"")
    steps = [line for f in sorted((EXAMPLES / "quickstart").glob("[0-9][0-9]-*.sh"))
             for line in f.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert lines[1:] == steps
    # the answer the README shows for the read is the tested one
    assert (EXAMPLES / "quickstart" / "05-read.out").read_text().strip() in text
    # relative links of the README point at files that exist
    for target in re.findall(r"\]\((?!https?:)([^)#]+)", text):
        assert (REPO / target).exists(), target


def test_the_compiled_rule_shown_is_what_the_compiler_writes():
    rule = rule_from_json(yaml.safe_load((EXAMPLES / "quickstart" / "rain.yaml").read_text()))
    assert rule_to_xacml(rule) == (EXAMPLES / "quickstart" / "rain.xacml.xml").read_bytes()


def test_the_example_documents_parse():
    for path in EXAMPLES.rglob("*.json"):
        json.loads(path.read_text())
    for path in EXAMPLES.rglob("*.ndjson"):
        for line in path.read_text().splitlines():
            assert isinstance(json.loads(line), dict), path
    for path in EXAMPLES.rglob("*.yaml"):
        assert isinstance(yaml.safe_load(path.read_text()), dict), path
