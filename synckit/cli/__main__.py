"""``python -m synckit.cli``: the ``synckit`` command."""

from synckit.cli import main

main()
