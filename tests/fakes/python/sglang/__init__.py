"""Fake SGLang package: `import sglang` works and `python3 -m sglang.launch_server` runs the fake server."""

__version__ = "0.5.23"
