"""servebook: make LLM serving deployments provable."""

#: The one place the version is written (pyproject.toml's ``[tool.hatch.version]`` reads
#: it): ``importlib.metadata`` cost every start about 50 ms of CPU, a third of what
#: ``servebook --version`` may take.
__version__ = "0.1.0"


def version_line() -> str:
    """What ``servebook --version`` prints."""
    return f"servebook {__version__}"
