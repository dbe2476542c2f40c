"""The supervisor: everything that runs, watches and ends the processes of a job from outside.

watch      the one watch loop over a Job (the ranks' pids, exit codes, first death)
job        a command job (the user's program, its ranks started by hctool or by a wrapper)
faults     the FaultController: the fault clock, the kinds acted on from outside the ranks
targets    what a command after `--` is (torchrun, python -m, a script) and its world size
resolve    whether a function a fault or probe names exists in the program's source
procs      process sets in their own sessions, free ports, kill_tree, the ranks' environment
signals    the exit rule on SIGINT/SIGTERM/SIGHUP
stacks     py-spy stacks of the ranks
runlock    one run per folder
"""
