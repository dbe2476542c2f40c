"""Metadata lives in pyproject.toml; this file only adds the recorder's optional C hot path.
Without a C compiler the build goes on and hctool records through its Python path."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("hctool.consensus._fastpath", ["hctool/consensus/_fastpath.c"], optional=True)])
