"""`python -m safetensors ...` runs the command-line tool."""

from ._cli import main

raise SystemExit(main())
