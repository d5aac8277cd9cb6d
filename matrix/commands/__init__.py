"""CLI subcommands, one module each. Every module listed in ``COMMAND_MODULES`` exposes
``register(subparsers) -> None``, which adds its parser and sets ``handler`` to a typed function."""

COMMAND_MODULES: tuple[str, ...] = ("report", "results_doc")
