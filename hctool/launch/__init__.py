"""Launch serving topologies (frontend + TP ranks); `hctool launch` is a thin CLI over this."""

from hctool.launch.topology import Death, Topology, TopologyError

__all__ = ["Death", "Topology", "TopologyError"]
