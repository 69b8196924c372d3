"""The package version, in a module of its own so that any module may name it without importing
the package facade (which would be an import back up)."""

__version__ = "0.1.0"
