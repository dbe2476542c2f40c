"""`hctool chaos`: random fault schedules against a real engine run, invariant
checkers over what the processes did, shrinking, replay and CI sharding."""
