"""The ``toolfleet`` command: local infrastructure and the services."""

from __future__ import annotations

import click

from toolfleet.infra.cli import infra


@click.group()
def main() -> None:
    """toolfleet: run AI agents' tool calls on a fleet of workers, through Kafka."""


main.add_command(infra)
