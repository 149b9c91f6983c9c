"""``python -m toolfleet`` runs the ``toolfleet`` command."""

from toolfleet.app.cli import main

main()
