"""Launch serving topologies (frontend + TP ranks); `hctool launch` is a thin CLI over this."""

from hctool.launch.pd import PDTopology
from hctool.launch.topology import Death, Topology, TopologyError

__all__ = ["Death", "PDTopology", "Topology", "TopologyError"]
