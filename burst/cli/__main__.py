"""``python -m burst.cli``: the same as the ``burst`` command."""

from burst.cli import main

if __name__ == "__main__":
    main(prog_name="burst")
