"""The package's version, a bottom module: `--version` and the dialects that name the bridge to an agent read it."""

__version__ = "0.1.0"
