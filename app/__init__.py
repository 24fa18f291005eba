"""Arona: a multi-tenant control plane for LLM traffic."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("arona")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+source"
