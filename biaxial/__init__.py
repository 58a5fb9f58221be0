"""The ``biaxial`` command line: one entry point for every component (see ``biaxial --help``)."""

ROOT_LOGGER = "biaxial"  # the parent of every logger of the program
