"""One setting for the network every layer uses: `launch.network_interface` (pure functions).

A node often has several networks (management Ethernet, InfiniBand, a high-speed Ethernet), and
every layer picks its own unless told: Open MPI's TCP transport and its daemons' wire-up
(`btl_tcp_if_include`, `oob_tcp_if_include`), torch's Gloo (`GLOO_SOCKET_IFNAME`), NCCL's
bootstrap (`NCCL_SOCKET_IFNAME`) and Horovod's Gloo controller (`HOROVOD_GLOO_IFACE`). A job whose
layers disagree hangs at start-up or silently runs over the slow network. The setting is either
an interface name (`ib0`, the same on every node) or a subnet (`10.1.0.0/16`), from which each
rank finds its own interface, as names may differ between nodes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

NETWORK_ENV = "HPC_TRAIN_NETWORK"  # the setting, passed to the ranks by the driver
DEFAULT_MASTER_PORT = "29500"      # torch.distributed's rendezvous port when MASTER_PORT is unset
# The per-rank variables the setting owns; a spec that also sets one in launch.env is refused.
RANK_INTERFACE_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE")
MPI_INTERFACE_VARS = ("OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include")


def as_subnet(setting: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """The subnet the setting names, or None when it is an interface name."""
    if "/" not in setting:
        return None
    return ipaddress.ip_network(setting, strict=False)


def mpirun_interface_args(flavour: str, setting: str | None) -> list[str]:
    """mpirun flags that keep MPI and its daemons on the chosen network."""
    if not setting:
        return []
    if flavour == "openmpi":  # Open MPI takes a name or a CIDR subnet in both parameters
        return ["--mca", "btl_tcp_if_include", setting, "--mca", "oob_tcp_if_include", setting]
    if as_subnet(setting) is None:  # Hydra (MPICH, Intel MPI) takes an interface name only
        return ["-iface", setting]
    return []  # a subnet under Hydra: the ranks' own variables (rank_interface_env) still apply


def srun_interface_env(setting: str | None) -> dict[str, str]:
    """Under srun there is no mpirun: Open MPI's ranks read the same parameters from the
    environment."""
    if not setting:
        return {}
    return {name: setting for name in MPI_INTERFACE_VARS}


def interface_for(setting: str, addresses: Iterable[tuple[str, str]]) -> str:
    """This node's interface for the setting, given its (name, address) pairs.

    Raises LookupError naming what the node has, so a node without the network fails at start-up
    with the reason instead of hanging in the first collective.
    """
    addresses = list(addresses)
    subnet = as_subnet(setting)
    for name, address in addresses:
        if (subnet is None and name == setting) or (
                subnet is not None and ipaddress.ip_address(address) in subnet):
            return name
    have = ", ".join(f"{name} {address}" for name, address in addresses) or "none"
    raise LookupError(f"no interface {'in ' if subnet else ''}{setting} on this node "
                      f"(it has: {have})")


def address_for(setting: str, addresses: Iterable[tuple[str, str]]) -> str:
    """This node's address on the chosen network (for MASTER_ADDR)."""
    addresses = list(addresses)
    name = interface_for(setting, addresses)
    subnet = as_subnet(setting)
    return next(address for n, address in addresses
                if n == name and (subnet is None or ipaddress.ip_address(address) in subnet))


def rank_interface_env(setting: str | None, addresses: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The variables a rank sets before any collective library starts. They override what the
    site's environment holds: the spec's setting is the one the user chose for this job."""
    if not setting:
        return {}
    name = interface_for(setting, addresses)
    return {var: name for var in RANK_INTERFACE_VARS}
