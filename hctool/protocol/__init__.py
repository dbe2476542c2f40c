"""What both sides of the process boundary read: the supervisor (hctool's commands) and the
agent inside each rank (hctool/agent). Standard library only.

  env.py        every HCTOOL_* environment variable
  records.py    the trace format (ring records and side-table lines)
  runrecord.py  the run record a supervisor writes beside the traces (hctool-run.json)
  faults.py     the fault vocabulary: `KIND:key=value,...`, parsed and validated in one place
  safefile.py   files in folders others may write into: no planted link followed, no FIFO read
"""
