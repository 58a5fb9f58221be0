"""One module per subcommand. Each defines ``NAME``, ``HELP``, ``ORDER`` (position in
``--help``), ``add_arguments(parser)`` and ``run(args) -> int``. Modules are found
automatically; heavy imports belong inside ``run`` so ``biaxial --help`` stays fast."""
