"""`python -m laminar_assets.cli`: the same as the `laminar` command."""

from laminar_assets.cli import main

main()
