"""Code that runs inside rank processes.

site/ is put first on PYTHONPATH by hctool.procs.inject_env, so its
sitecustomize.py loads in every Python process of a job. It holds nothing
else: anything there would shadow a top-level module of the user's program.
Faults stay here, importable as hctool.inject.faults.
"""
