"""A rank's network preparation before any collective library starts (job/worker.join_network)."""

import pytest

from hpc_train.errors import LaunchError
from hpc_train.job.worker import join_network
from hpc_train.runtime.netif import ipv4_addresses


def test_every_layer_gets_the_interface_of_the_chosen_subnet():
    name, address = next((n, a) for n, a in ipv4_addresses() if n != "lo")
    environ = {"HPC_TRAIN_NETWORK": f"{address}/32", "MASTER_ADDR": "127.0.0.1",
               "GLOO_SOCKET_IFNAME": "site-default"}
    join_network(environ, 0)
    assert environ["GLOO_SOCKET_IFNAME"] == environ["NCCL_SOCKET_IFNAME"] == name
    assert environ["HOROVOD_GLOO_IFACE"] == name


def test_a_node_without_the_network_fails_with_its_name_and_interfaces():
    with pytest.raises(LaunchError, match=r"rank 3 on \S+: launch.network_interface: no interface "
                                          r"in 203\.0\.113\.0/24 on this node \(it has: lo 127"):
        join_network({"HPC_TRAIN_NETWORK": "203.0.113.0/24"}, 3)


def test_an_unresolvable_master_fails_before_the_rendezvous():
    with pytest.raises(LaunchError, match=r"MASTER_ADDR 'no-such-node\.invalid' does not resolve"):
        join_network({"MASTER_ADDR": "no-such-node.invalid"}, 1)
