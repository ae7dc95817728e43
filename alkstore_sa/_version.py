"""This release's version, in a module of its own at the bottom of the package, so
that any module may read it without importing the package's top."""

__version__ = "0.1.0"
