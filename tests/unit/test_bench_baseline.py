"""``python -m bench --baseline REF``: a commit's tree written out once, its code imported from it.

Real git on this clone (``git archive HEAD``) and a real child interpreter; no broker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.baseline import COMPLETE, BaselineError, materialise, resolve


def test_a_commit_tree_is_written_out_once_and_reused(tmp_path: Path) -> None:
    sha = resolve("HEAD")
    first = materialise("HEAD", home=tmp_path)
    assert first.sha == sha
    assert first.root == (tmp_path / sha).resolve()
    assert first.system == f"toolfleet@{sha[:7]}"
    assert (first.root / "toolfleet" / "__main__.py").is_file()
    assert (first.root / "bench" / "tools.py").is_file()
    assert (first.root / COMPLETE).read_text().strip() == sha
    left_there = first.root / "left-there"
    left_there.write_text("a second run must not write the tree again")
    again = materialise(sha[:10], home=tmp_path)
    assert again.root == first.root
    assert left_there.exists()
    assert [p.name for p in tmp_path.iterdir()] == [sha]  # no half-written tree left beside it


def test_a_tree_cut_short_is_written_out_again(tmp_path: Path) -> None:
    sha = resolve("HEAD")
    (tmp_path / sha / "toolfleet").mkdir(parents=True)  # a tree without its marker
    (tmp_path / f".{sha}.12345" / "kernel").mkdir(parents=True)  # ... or mid-extract
    tree = materialise("HEAD", home=tmp_path)
    assert (tree.root / COMPLETE).is_file()
    assert (tree.root / "toolfleet" / "__main__.py").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [sha]


def test_an_unknown_ref_says_how_to_go_on() -> None:
    with pytest.raises(BaselineError, match=r"no commit 'no-such-ref'.*BENCH_BASELINE="):
        resolve("no-such-ref")


def test_the_services_import_every_package_from_the_tree(tmp_path: Path) -> None:
    tree = materialise("HEAD", home=tmp_path)
    found = tree.check_imports()
    assert set(found) >= {"toolfleet", "kernel", "planner", "executors", "bench.tools"}
    assert all(Path(f).is_relative_to(tree.root) for f in found.values()), found
