"""The collective recorder, inside each rank (docs/consensus.md). Dependencies point one way:
install -> wrappers -> c10d -> funcol -> recorder -> tracefile -> state (and cxx_kernel)."""
