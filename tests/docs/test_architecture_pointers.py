"""Every pointer of docs/architecture.md resolves, and each rule of its section 7 has one home.

A pointer is a path in backticks (it must exist), optionally followed by ``·`` and the names
it defines (``Name``, ``Class.method``, a list of them: each must be defined in that file, read
with ``ast``); a ``Class.member`` in backticks anywhere else must name a member of a class of
the project. A row of section 7 ("Where each rule lives") names at most two files: the place
that decides its rule and at most one that applies it.
"""

from __future__ import annotations

import ast
import functools
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).parents[2]
DOC = REPO / "docs" / "architecture.md"
PACKAGES = ("aggregator", "bench", "executors", "kernel", "planner", "reconciler", "schemas",
            "toolfleet")  # fmt: skip
MAX_FILES_PER_RULE = 2

_TICKED = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"^\.?[\w.-]+(?:/[\w.-]+)*/?$")
_NAME = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?$")
_MEMBER = re.compile(r"^([A-Z]\w*)\.([A-Za-z_]\w*)$")
_CALL_SUFFIX = re.compile(r"\(.*\)$")
_SEPARATOR = re.compile(r"^\s*(?:,|and|, and|or)\s*$")
_PARENS = re.compile(r"\([^()]*\)")
_FILE_SUFFIXES = (".py", ".lua", ".md", ".toml", ".yaml", ".yml", ".json", ".cfg", ".txt")


@dataclass(frozen=True)
class Pointer:
    """A path, and the names the document says it defines."""

    line: int
    path: str
    names: tuple[str, ...]


def _is_path(token: str) -> bool:
    if "<" in token or " " in token or not _PATH.match(token):
        return False
    return "/" in token or token.endswith(_FILE_SUFFIXES)


def _is_file(token: str) -> bool:
    return _is_path(token) and "/" in token and not token.endswith("/")


def _between(text: str) -> str:
    """What lies between two ticked tokens, parenthesised asides removed."""
    while (shorter := _PARENS.sub("", text)) != text:
        text = shorter
    return text


def pointers(text: str, line: int) -> Iterator[Pointer]:
    """The ``path · Name, Name`` pointers of one line of the document."""
    ticks = list(_TICKED.finditer(text))
    for i, tick in enumerate(ticks):
        path = tick.group(1)
        if not _is_file(path):
            continue
        names: list[str] = []
        rest = text[tick.end() :]
        if rest.startswith(" · ") and i + 1 < len(ticks):
            end = tick.end()
            for following in ticks[i + 1 :]:
                gap = text[end : following.start()]
                if gap.count("(") > gap.count(")"):
                    continue  # inside an aside

                if names and not _SEPARATOR.match(_between(gap)):
                    break
                if not names and gap != " · ":
                    break
                name = _CALL_SUFFIX.sub("", following.group(1))
                if not _NAME.match(name) or _is_path(following.group(1)):
                    break
                names.append(name)
                end = following.end()
        yield Pointer(line, path, tuple(names))


@functools.cache
def _definitions(path: Path) -> frozenset[str]:
    """Every name ``path`` defines: module level, and ``Class.member`` and ``member`` of its
    classes (methods, properties, fields)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()

    def assigned(node: ast.stmt) -> list[str]:
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return [node.name]
        return []

    for node in tree.body:
        names.update(assigned(node))
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                for name in assigned(member):
                    names.update({f"{node.name}.{name}", name})
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef) and (
                    member.name == "__init__"
                ):
                    # Attributes set in __init__ (self.x = ...) are members too.
                    for sub in ast.walk(member):
                        if (
                            isinstance(sub, ast.Attribute)
                            and isinstance(sub.ctx, ast.Store)
                            and isinstance(sub.value, ast.Name)
                            and sub.value.id == "self"
                        ):
                            names.add(f"{node.name}.{sub.attr}")
    return frozenset(names)


@functools.cache
def _project_members() -> dict[str, frozenset[str]]:
    """Class name -> its members, over every module of the project's packages."""
    members: dict[str, set[str]] = {}
    for package in PACKAGES:
        for module in (REPO / package).rglob("*.py"):
            for name in _definitions(module):
                if "." in name:
                    cls, member = name.split(".", 1)
                    members.setdefault(cls, set()).add(member)
    return {cls: frozenset(names) for cls, names in members.items()}


def _lines() -> list[tuple[int, str]]:
    return list(enumerate(DOC.read_text().splitlines(), start=1))


def _section(number: int) -> list[tuple[int, str]]:
    lines = _lines()
    start = next(i for i, (_, text) in enumerate(lines) if text.startswith(f"## {number}. "))
    end = next(
        (i for i, (_, text) in enumerate(lines) if i > start and text.startswith("## ")),
        len(lines),
    )
    return lines[start:end]


def _rule_rows() -> list[tuple[int, str, str]]:
    """(line, rule, where it is decided) of every table row of section 7."""
    rows = []
    for line, text in _section(7):
        if not text.startswith("| ") or text.startswith(("| rule |", "| row |")):
            continue
        rule, _, decided = text[2:].rstrip(" |").partition(" | ")
        rows.append((line, rule, decided))
    return rows


def _checked(path: str) -> bool:
    """Whether a path token is checked: a folder named alone ("console/") is read under the
    one named before it, and ``.artifacts/`` is made by a test run."""
    return _is_path(path) and "/" in path.rstrip("/") and not path.startswith(".artifacts/")


def test_every_path_in_the_document_exists() -> None:
    missing = [
        f"line {line}: {path}"
        for line, text in _lines()
        for path in (t.group(1) for t in _TICKED.finditer(text))
        if _checked(path) and not (REPO / path).exists()
    ]
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_every_pointer_names_what_its_file_defines() -> None:
    wrong = [
        f"line {p.line}: {p.path} · {name}"
        for line, text in _lines()
        for p in pointers(text, line)
        if p.path.endswith(".py") and (REPO / p.path).exists()
        for name in p.names
        if name not in _definitions(REPO / p.path)
    ]
    assert not wrong, "names their files do not define:\n" + "\n".join(wrong)


def test_every_class_member_named_exists() -> None:
    members = _project_members()
    wrong = []
    for line, text in _lines():
        for tick in _TICKED.finditer(text):
            match = _MEMBER.match(_CALL_SUFFIX.sub("", tick.group(1)))
            if match is None:
                continue
            cls, member = match.groups()
            if member not in members.get(cls, frozenset()):
                wrong.append(f"line {line}: {cls}.{member}")
    assert not wrong, "class members that no project class has:\n" + "\n".join(wrong)


def test_no_rule_names_more_than_two_files() -> None:
    rows = _rule_rows()
    assert len(rows) > 50, "section 7's tables were not found"
    crowded = []
    for line, rule, decided in rows:
        files = {t.group(1) for t in _TICKED.finditer(decided) if _is_file(t.group(1))}
        if len(files) > MAX_FILES_PER_RULE:
            crowded.append(f"line {line}: {rule[:60]!r} names {len(files)}: {sorted(files)}")
    assert not crowded, "rules that name more than two files:\n" + "\n".join(crowded)


def test_the_pointer_reader_reads_lists_and_asides() -> None:
    text = (
        "`a/b.py` · `F.x` (`aside`), `g` and `H.y`; `c/d.py` · `k`, from the `Z`; "
        "`e/f.py` (`not_a_pointer`)"
    )
    assert list(pointers(text, 1)) == [
        Pointer(1, "a/b.py", ("F.x", "g", "H.y")),
        Pointer(1, "c/d.py", ("k",)),
        Pointer(1, "e/f.py", ()),
    ]


def _contracts() -> list[dict[str, object]]:
    with (REPO / "pyproject.toml").open("rb") as file:
        contracts: list[dict[str, object]] = tomllib.load(file)["tool"]["importlinter"]["contracts"]
    return contracts


def _table(section: int, header: str) -> list[list[str]]:
    """The cells of the rows of the table of ``section`` whose header row starts ``header``."""
    rows: list[list[str]] = []
    inside = False
    for _, text in _section(section):
        if text.startswith(header):
            inside = True
        elif inside and text.startswith("|") and not text.startswith("|---"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", text.strip("|"))])
        elif inside and not text.startswith("|"):
            break
    return rows


def test_the_layers_are_the_layers_contract() -> None:
    [layers] = [c["layers"] for c in _contracts() if c["id"] == "layers"]
    documented = [row[0].replace("`", "").replace("\\|", "|") for row in _table(2, "| layer")]
    assert documented == layers


def test_the_contract_table_names_every_contract_as_pyproject_does() -> None:
    documented = {row[0].strip("`"): row[1] for row in _table(2, "| contract id")}
    assert documented == {str(c["id"]): str(c["name"]) for c in _contracts()}
