"""`python -m ckptinspect`: the CLI (ckptinspect/cli)."""

from ckptinspect.cli import main

main()
