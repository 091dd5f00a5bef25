"""`python -m safetensors._cli ...` runs the command-line tool."""

from . import main

raise SystemExit(main())
