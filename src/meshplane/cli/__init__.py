"""The ``meshplane`` command line."""
