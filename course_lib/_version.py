"""The single source of the package version (read by pyproject.toml and ``course_lib.__version__``)."""

__version__ = "0.2.0"
