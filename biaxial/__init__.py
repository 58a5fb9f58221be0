"""The ``biaxial`` command line: one entry point for every component (see ``biaxial --help``)."""
