"""tests/docs/readme.py: what it extracts, and that a run fails when a block is broken.

The runs use a real bash and the test's own virtualenv; no broker is involved.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest

from tests.docs.readme import BlockFailed, read_blocks, run_readme

DOC = """\
# Title

```sh
export GREETING=hello
```

<!-- not run: needs a cluster -->
```sh
kubectl apply -f x.yaml
```

```python
import os
print(os.environ["GREETING"], "world")
```

<!-- output -->
```text
hello world
```

```yaml
a: 1
```
"""


def run(tmp_path: Path, text: str) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(text)
    run_readme(readme, workdir=tmp_path, venv=Path(sys.prefix), env=dict(os.environ), timeout=60)


def test_blocks_carry_their_language_line_and_markers() -> None:
    blocks = read_blocks(DOC)
    assert [(b.language, b.line, b.kind, b.runs) for b in blocks] == [
        ("sh", 3, "shell", True),
        ("sh", 8, "shell", False),
        ("python", 12, "python", True),
        ("yaml", 22, None, False),
    ]
    assert blocks[1].not_run == "needs a cluster"
    assert blocks[2].output == "hello world\n"


def test_a_not_run_marker_needs_a_reason_and_an_output_block_a_block_before_it() -> None:
    with pytest.raises(ValueError, match="not run: REASON"):
        read_blocks("<!-- not run -->\n```sh\nls\n```\n")
    with pytest.raises(ValueError, match="must follow a block that runs"):
        read_blocks("<!-- output -->\n```text\nx\n```\n")


def test_shell_state_carries_over_to_python_blocks_and_outputs_are_checked(
    tmp_path: Path,
) -> None:
    run(tmp_path, DOC)  # the exported variable reaches the Python block; its output matches
    with pytest.raises(BlockFailed, match="line 12 did not print 'hello there'"):
        run(tmp_path, DOC.replace("hello world\n```", "hello there\n```"))


def test_a_failing_block_is_named_by_its_line(tmp_path: Path) -> None:
    with pytest.raises(BlockFailed, match="block at line 3 exited with 1"):
        run(tmp_path, "# T\n\n```sh\ntrue\nfalse\necho never\n```\n")
    with pytest.raises(BlockFailed, match="block at line 1 exited with 1"):
        run(tmp_path, "```python\nraise SystemExit(1)\n```\n")


def test_background_jobs_a_run_leaves_are_reported_and_stopped(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("```sh\nsleep 300 &\necho $! > sleeper.pid\n```\n")
    done = run_readme(
        readme, workdir=tmp_path, venv=Path(sys.prefix), env=dict(os.environ), timeout=60
    )
    pid = int((tmp_path / "sleeper.pid").read_text())
    # By its pid: under load the job may not have become ``sleep`` yet (still the shell's fork).
    assert [line.split()[0] for line in done.leftovers] == [str(pid)]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
