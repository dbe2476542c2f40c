"""The agent: everything hctool runs inside a rank. It imports only the standard library,
torch and hctool.protocol (plus engine.lab's seams for engine faults), never the supervisor's
code, and it never raises into the user's program (a failure is one `hctool:` line on stderr).

  site/sitecustomize.py  loaded by every Python process of a job (hctool.supervise.procs.inject_env)
  lifeline.py            the rank exits when the supervising hctool dies
  hooks.py               the one import hook (act right after a module is executed)
  capture/               the collective recorder: state, tracefile, recorder (hot path),
                         wrappers (Python API), c10d/funcol (dispatcher routes), install
  faults.py, counts.py   in-rank faults, and how often each fired
  names.py, probes.py    acting on a function by its qualified name; probes
  chaos_observer.py      the engine's tick observer for chaos runs
  api.py                 assert_same / rank_consensus (public as hctool.consensus.*)
  clock.py               the real clocks, before any fault patches them
"""
