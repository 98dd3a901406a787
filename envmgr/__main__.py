"""``python -m envmgr``: the same as the ``envmgr`` command."""

from envmgr.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
