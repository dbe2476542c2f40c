"""Metadata lives in pyproject.toml; this file only adds the recorder's optional C hot path.
Without a C compiler the build goes on and hctool records through its Python path."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("hctool.agent.capture._fastpath", ["hctool/agent/capture/_fastpath.c"], optional=True)])
