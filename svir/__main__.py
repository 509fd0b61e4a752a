"""`python -m svir` runs the command line."""

from svir.cli import main

raise SystemExit(main())
