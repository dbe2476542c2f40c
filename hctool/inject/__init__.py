"""Code that runs inside rank processes.

This folder is put first on PYTHONPATH by hctool.procs.inject_env, so its
sitecustomize.py loads in every Python process of a job. Keep it free of other
top-level module names: anything here is importable as a top-level module.
"""
