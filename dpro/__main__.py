"""``python -m dpro``: the same as the ``dpro`` command."""

from dpro.cli import main

main(prog_name="dpro")
