"""`python -m service.cli`: the same as the `strata` console script."""

from service.cli import main

main()
