"""servebook: make LLM serving deployments provable."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("servebook")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"
