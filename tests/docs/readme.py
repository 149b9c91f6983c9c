"""Run a Markdown file's shell and Python blocks in order, as a reader would copy-paste them.

``read_blocks`` lists the fenced blocks of a Markdown text (parsed with markdown-it-py);
``run_readme`` runs its shell and Python blocks, top to bottom, in one bash process: shell
blocks as they are (so ``export``, ``eval`` and background ``&`` jobs carry over from one to
the next, as in a reader's terminal), Python blocks saved to files and run with the
virtualenv's ``python`` in that same shell (so they see what the shell blocks exported).
``set -eo pipefail`` stops the run at the first command that fails; the failure names the
block and its line. Processes a block left running are stopped afterwards.

Two markers, HTML comments on the line right before a block (invisible once rendered):

- ``<!-- not run: REASON -->``: the block is not run (``make test`` itself, say); the reason
  is required, and shown in the test's report. Use it sparingly.
- ``<!-- output -->``: the block is what the runnable block before it prints: each of its
  lines must appear in that block's stdout, in order (other lines may come between).

Used by ``tests/docs/test_readme.py`` against the development virtualenv; the packaging test
reuses it against a fresh virtualenv built from the wheel (pass that one as ``venv``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil
from markdown_it import MarkdownIt

SHELL = frozenset({"sh", "bash", "shell", "console"})
PYTHON = frozenset({"python", "py", "python3"})
_NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->\s*$", re.DOTALL)
_OUTPUT = re.compile(r"^<!--\s*output\s*-->\s*$")
_MARK = "::readme block line "


@dataclass(frozen=True)
class Block:
    """One fenced block of a Markdown text."""

    language: str
    """The first word of the fence's info string (``sh``, ``python``, ``text``...)."""
    code: str
    line: int
    """1-based line of the opening fence."""
    not_run: str | None = None
    """The reason given by a ``<!-- not run: ... -->`` marker, if any."""
    output: str | None = None
    """What the block must print (the ``<!-- output -->`` block after it), if given."""

    @property
    def kind(self) -> Literal["shell", "python"] | None:
        """Which interpreter runs it; None for blocks that are not code to run."""
        if self.language in SHELL:
            return "shell"
        if self.language in PYTHON:
            return "python"
        return None

    @property
    def runs(self) -> bool:
        """Whether ``run_readme`` runs it."""
        return self.kind is not None and self.not_run is None


class BlockFailed(AssertionError):
    """A block failed, printed something else than its output block, or hung."""


@dataclass(frozen=True)
class ReadmeRun:
    """What a run of the blocks left behind."""

    blocks: list[Block]
    """Every block of the file, run or not."""
    stdout: str
    stderr: str
    leftovers: list[str]
    """Processes the blocks left running (stopped by ``run_readme``), as ``pid cmdline``."""


def read_blocks(markdown: str) -> list[Block]:
    """Every fenced block, with its markers; an output block is attached, not listed."""
    tokens = MarkdownIt("commonmark").parse(markdown)
    blocks: list[Block] = []
    marker: str | None = None
    for token in tokens:
        if token.type == "html_block":
            marker = token.content.strip()
            continue
        if token.type == "fence" and token.map is not None:
            language = (token.info.split() or [""])[0].lower()
            block = Block(language=language, code=token.content, line=token.map[0] + 1)
            if marker is not None and _OUTPUT.match(marker):
                if not blocks or not blocks[-1].runs:
                    raise ValueError(
                        f"line {block.line}: an output block must follow a block that runs"
                    )
                previous = blocks.pop()
                blocks.append(_replace(previous, output=block.code))
            elif marker is not None and (found := _NOT_RUN.match(marker)):
                blocks.append(_replace(block, not_run=found["reason"]))
            else:
                if marker is not None and marker.startswith("<!--") and "not run" in marker:
                    raise ValueError(f"line {block.line}: write <!-- not run: REASON -->")
                blocks.append(block)
        marker = None
    return blocks


def _replace(block: Block, **changes: str) -> Block:
    return Block(**{**block.__dict__, **changes})


def script(blocks: Sequence[Block], files: Path, python: Path) -> str:
    """The bash script that runs ``blocks`` in order (Python blocks from files in ``files``)."""
    lines = ["set -eo pipefail"]
    for block in blocks:
        if not block.runs:
            continue
        lines.append(f"echo '{_MARK}{block.line}' >&2")
        if block.kind == "shell":
            lines.append(block.code.rstrip("\n"))
        else:
            source = files / f"block-{block.line}.py"
            source.write_text(block.code)
            out = files / f"block-{block.line}.out"
            lines.append(f"'{python}' '{source}' | tee '{out}'")
    lines.append(f"echo '{_MARK}end' >&2")
    return "\n".join(lines) + "\n"


def run_readme(
    path: Path,
    *,
    workdir: Path,
    venv: Path,
    env: Mapping[str, str],
    timeout: float = 600.0,
) -> ReadmeRun:
    """Run the shell and Python blocks of ``path`` in order, in ``workdir``.

    ``workdir/.venv`` is made a link to ``venv`` (the README activates ``.venv``), and
    Python blocks run with its ``python``. ``env`` is the whole environment of the shell.
    Raises ``BlockFailed`` naming the first block that failed or printed something else.
    """
    blocks = read_blocks(path.read_text())
    files = workdir / ".readme-blocks"
    files.mkdir(parents=True, exist_ok=True)
    link = workdir / ".venv"
    if not link.exists():
        link.symlink_to(venv.resolve(), target_is_directory=True)
    runner = files / "run.sh"
    runner.write_text(script(blocks, files, venv / "bin" / "python"))
    stdout_file, stderr_file = files / "stdout", files / "stderr"
    with stdout_file.open("w") as stdout, stderr_file.open("w") as stderr:
        # A session of its own: every process the blocks start is in its process group, and
        # files rather than pipes, so a background job holding them cannot block the wait.
        proc = subprocess.Popen(
            ["bash", str(runner)],
            cwd=workdir,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            leftovers = _stop_group(proc.pid)
    run = ReadmeRun(blocks, stdout_file.read_text(), stderr_file.read_text(), leftovers)
    if code != 0:
        line = _last_block(run.stderr)
        what = "did not finish in time" if code is None else f"exited with {code}"
        raise BlockFailed(f"{path.name}: the block at line {line} {what}\n{_tails(run)}")
    for block in blocks:
        if block.runs and block.output is not None:
            printed = (files / f"block-{block.line}.out").read_text()
            missing = _missing(block.output, printed)
            if missing is not None:
                raise BlockFailed(
                    f"{path.name}: the block at line {block.line} did not print {missing!r} "
                    f"(in order); it printed:\n{printed}"
                )
    return run


def _missing(expected: str, printed: str) -> str | None:
    """The first expected line not found in order in ``printed``; None if all are."""
    lines = iter(line.rstrip() for line in printed.splitlines())
    for want in (line.rstrip() for line in expected.splitlines()):
        if want and not any(got == want for got in lines):
            return want
    return None


def _last_block(stderr: str) -> str:
    marks = [line[len(_MARK) :] for line in stderr.splitlines() if line.startswith(_MARK)]
    return marks[-1] if marks else "?"


def _tails(run: ReadmeRun) -> str:
    out = "\n".join(run.stdout.splitlines()[-30:])
    err = "\n".join(run.stderr.splitlines()[-40:])
    return f"--- stdout (tail)\n{out}\n--- stderr (tail)\n{err}"


def _stop_group(pgid: int) -> list[str]:
    """Stop what is left of process group ``pgid`` (SIGTERM, then SIGKILL); what was left."""
    left = [p for p in psutil.process_iter(["cmdline"]) if _in_group(p, pgid)]
    described = [f"{p.pid} {' '.join(p.info['cmdline'] or [])}" for p in left]
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        if not left:
            break
        for p in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)
        _, left = psutil.wait_procs(left, timeout=grace)
    return described


def _in_group(process: psutil.Process, pgid: int) -> bool:
    try:
        return os.getpgid(process.pid) == pgid
    except (ProcessLookupError, PermissionError):
        return False
