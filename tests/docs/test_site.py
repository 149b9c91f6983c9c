"""The documentation site builds with `mkdocs build --strict`, and its generated settings page
is `kernel.settings.Settings`, field by field."""

from __future__ import annotations

import html
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from kernel.settings import Settings

REPO = Path(__file__).parents[2]
MKDOCS = Path(sys.executable).with_name("mkdocs")


def _generator() -> ModuleType:
    """scripts/settings_reference.py (a script and a MkDocs hook, not a package module)."""
    spec = importlib.util.spec_from_file_location(
        "settings_reference", REPO / "scripts" / "settings_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _generator()


def nav_pages(nav: list[object]) -> list[str]:
    """Every page of a MkDocs nav, depth first."""
    found: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            found += nav_pages(value)
        else:
            found.append(str(value))
    return found


def test_the_site_builds_strictly_with_every_page_in_its_nav(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    pages = nav_pages(config["nav"])
    on_disk = sorted(str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md"))
    assert sorted(pages) == on_disk
    for page in ("console-access.md", "troubleshooting.md", "settings.md", "benchmarks.md"):
        assert page in pages
    built = (site / "settings" / "index.html").read_text()
    for name, field in Settings.model_fields.items():
        assert html.escape(reference.env_names(name, field)[0], quote=False) in built, name


def test_the_settings_page_has_one_row_per_setting_with_its_variable_and_default() -> None:
    page = reference.render()
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    assert len(rows) == len(Settings.model_fields)
    assert f"{len(Settings.model_fields)} settings" in page
    by_variable = {}
    for row in rows:
        found = re.match(r"\| `([^`]+)`", row)
        assert found is not None, row
        by_variable[found[1]] = row
    for name, field in Settings.model_fields.items():
        row = by_variable[reference.env_names(name, field)[0]]
        assert f"; default {reference.default_of(field)} |" in row, row
        assert field.description and " ".join(field.description.split()) in row.replace(
            "\\|", "|"
        ), f"{name} has no description, or the page does not show it"


def test_the_variables_the_page_names_are_the_ones_settings_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fields = Settings.model_fields
    names = {name: reference.env_names(name, field) for name, field in fields.items()}
    assert names["redis_url"] == ["REDIS_URL", "TOOLFLEET_REDIS_URL"]
    assert names["kafka_bootstrap_servers"] == [
        "KAFKA_BOOTSTRAP_SERVERS",
        "TOOLFLEET_KAFKA_BOOTSTRAP_SERVERS",
    ]
    for variable in ("REDIS_URL", "TOOLFLEET_REDIS_URL"):
        monkeypatch.delenv("REDIS_URL", raising=False)
        monkeypatch.delenv("TOOLFLEET_REDIS_URL", raising=False)
        monkeypatch.setenv(variable, "redis://example:1/0")
        assert Settings().redis_url == "redis://example:1/0"
    monkeypatch.setenv(names["decision_keys"][0], '{"acme": "k"}')
    monkeypatch.setenv(names["circuit_min_calls"][0], "7")
    monkeypatch.setenv(names["topic_prefix"][0], "p.")
    settings = Settings()
    assert (settings.decision_keys, settings.circuit_min_calls, settings.topic_prefix) == (
        {"acme": "k"},
        7,
        "p.",
    )


def test_the_bench_refreshes_the_latest_run_block_of_the_benchmarks_page(tmp_path: Path) -> None:
    from bench.__main__ import BENCH_PAGE
    from bench.report import README_BEGIN, README_END, update_readme

    assert BENCH_PAGE == REPO / "docs" / "benchmarks.md"
    text = BENCH_PAGE.read_text()
    assert text.count(README_BEGIN) == 1 and text.count(README_END) == 1
    page = tmp_path / "benchmarks.md"
    page.write_text(text)
    update_readme(page, f"{README_BEGIN}\nnew numbers\n{README_END}")
    before, _, after = text.partition(README_BEGIN)
    assert page.read_text() == (
        before + f"{README_BEGIN}\nnew numbers\n{README_END}" + after.partition(README_END)[2]
    )
