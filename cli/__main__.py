"""``python -m cli``: the ``dledger`` command."""

from cli import main

main()
