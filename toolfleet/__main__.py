"""``python -m toolfleet`` runs the ``toolfleet`` command."""

from toolfleet.cli import main

main()
