"""The package version (its own module: the servers report it without importing the event plane)."""

__version__ = "0.1.0"  # as pyproject.toml says
