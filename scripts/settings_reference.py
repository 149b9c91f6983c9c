"""The settings reference page, generated from ``kernel.settings.Settings``.

Every field becomes one row: the environment variable(s) it is read from, its type and bounds,
its default and its description, so the page cannot drift from the code. Two ways in:

- ``python scripts/settings_reference.py`` prints the page (Markdown) on stdout;
- as a MkDocs hook (``hooks:`` in ``mkdocs.yml``), it replaces the body of ``docs/settings.md``
  (a stub in the repository) when the site is built.
"""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import annotated_types
from pydantic import AliasChoices, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from kernel.settings import Settings

PAGE = "settings.md"
"""The page of the site this hook fills in (relative to ``docs/``)."""

_INTRO = """\
# Settings

Every service, `FleetClient`, `FleetRunner` and the `toolfleet` command read their settings
from the environment (and nowhere else), through `kernel.settings.Settings`: one variable per
setting, named `TOOLFLEET_` and the setting's name in capitals; `KAFKA_BOOTSTRAP_SERVERS` and
`REDIS_URL` are also read without the prefix, because they are the names platforms already
export. Names are not case-sensitive. A setting of a JSON type is given as JSON
(`TOOLFLEET_DECISION_KEYS='{{"acme": "secret"}}'`); true/false settings accept `true`, `false`,
`1`, `0`, `yes`, `no`. A value the type or bounds refuse stops the process at start, naming the
setting.

This page is generated from `kernel/settings.py` when the site is built
(`scripts/settings_reference.py`); {count} settings, in the order of their variables.

| variable | what it does |
|---|---|
"""


def env_names(name: str, field: FieldInfo) -> list[str]:
    """The environment variables ``field`` is read from, the preferred one first."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    if isinstance(alias, str):
        return [alias]
    prefix = str(Settings.model_config.get("env_prefix", ""))
    return [f"{prefix}{name}".upper()]


def type_of(annotation: Any) -> str:
    """A reader's name for a field's type (``integer``, ``one of a, b``, ``JSON object``...)."""
    origin = get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        kinds = [type_of(arg) for arg in get_args(annotation) if arg is not type(None)]
        return " or ".join(kinds)
    if origin is Literal:
        return "one of " + ", ".join(f"`{value}`" for value in get_args(annotation))
    if origin is dict or annotation is dict:
        return "JSON object"
    if origin in (tuple, list) or annotation in (tuple, list):
        return "JSON array"
    names = {
        bool: "true/false",
        int: "integer",
        float: "number",
        str: "text",
        Path: "path",
        SecretStr: "secret text",
    }
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def bounds_of(field: FieldInfo) -> str:
    """The field's numeric bounds, as ``≥ 1``, ``> 0, ≤ 1``."""
    found = []
    for item in field.metadata:
        for attribute, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(item, attribute, None)
            if isinstance(item, annotated_types.BaseMetadata) and value is not None:
                found.append(f"{sign} {value}")
    return ", ".join(found)


def default_of(field: FieldInfo) -> str:
    """The default as a reader would write it in the environment."""
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Path):
        home = str(Path.home())
        text = str(value)
        return f"`~{text[len(home) :]}`" if text.startswith(home) else f"`{text}`"
    if isinstance(value, dict | tuple | list):
        return f"`{json.dumps(value)}`"
    if isinstance(value, str) and not value:
        return "empty"
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def rows() -> list[tuple[str, str, str, str]]:
    """(variables, type, default, description) of every setting, sorted by variable."""
    found = []
    for name, field in Settings.model_fields.items():
        names = env_names(name, field)
        variables = "`" + names[0] + "`" + "".join(f" (or `{n}`)" for n in names[1:])
        kind = type_of(field.annotation)
        bounds = bounds_of(field)
        kind = f"{kind}, {bounds}" if bounds else kind
        description = field.description or ""
        found.append((variables, kind, default_of(field), description))
    return sorted(found, key=lambda row: row[0].strip("`").removeprefix("TOOLFLEET_"))


def render() -> str:
    """The whole settings page, in Markdown."""
    table = rows()
    lines = [_INTRO.format(count=len(table)).rstrip("\n")]
    for variables, kind, default, description in table:
        # Two columns, the type and default under the name: the names are long and unbreakable.
        lines.append(
            f"| {variables}<br>{_cell(kind)}; default {_cell(default)} "
            f"| {_cell(description) or '-'} |"
        )
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """MkDocs hook: the settings page's body is generated; every other page is left alone."""
    return render() if page.file.src_uri == PAGE else markdown


if __name__ == "__main__":
    print(render(), end="")
