"""launch.network_interface: one setting for MPI, Gloo, NCCL and Horovod (pure functions)."""

import pytest

from hpc_train.launch.network import address_for, interface_for, rank_interface_env

NODE = [("lo", "127.0.0.1"), ("eth0", "192.168.1.5"), ("ib0", "10.1.3.7")]


def test_interface_by_name_or_by_subnet():
    assert interface_for("ib0", NODE) == "ib0"
    assert interface_for("10.1.0.0/16", NODE) == "ib0"
    assert interface_for("192.168.1.0/24", NODE) == "eth0"
    assert address_for("10.1.0.0/16", NODE) == "10.1.3.7"
    assert address_for("eth0", NODE) == "192.168.1.5"


def test_a_node_without_the_network_is_named_with_what_it_has():
    with pytest.raises(LookupError, match=r"no interface in 10\.9\.0\.0/16 .*eth0 192\.168\.1\.5"):
        interface_for("10.9.0.0/16", NODE)
    with pytest.raises(LookupError, match="no interface ib1 "):
        interface_for("ib1", NODE)


def test_every_layer_gets_the_same_interface():
    env = rank_interface_env("10.1.0.0/16", NODE)
    assert env == {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0", "HOROVOD_GLOO_IFACE": "ib0"}
    assert rank_interface_env(None, NODE) == {}
