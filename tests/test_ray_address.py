"""`ck sweep --executor ray --address ...`: a malformed address is a ConfigError before Ray is
imported; an address where no cluster listens fails within seconds (Ray alone retries for
minutes), with an error that says what to do."""
import socket
import time

import pytest

from ck_core import CkError, ConfigError
from ck_core.cli import main as ck_main
from ck_core.sweep.engine import Options, run_sweep
from ck_core.sweep.ray_executor import parse_address

BAD = ["", "   ", "127.0.0.1", "127.0.0.1:", "127.0.0.1:abc", "127.0.0.1:0", "127.0.0.1:65536",
       "127.0.0.1:-5", "http://127.0.0.1:6379", "ray://", "host name:6379", "a..b:1", "[::1:6379",
       "[not-ipv6]:6379", "1.2.3.4:6379; rm -rf /", "\x00:1", "x" * 300 + ":1", ":6379"]
GOOD = {"auto": None, "local": None, "127.0.0.1:6379": ("127.0.0.1", 6379),
        "ray://head.cluster.local:10001": ("head.cluster.local", 10001), "[::1]:6379": ("::1", 6379),
        " 10.0.0.5:6379 ": ("10.0.0.5", 6379)}


@pytest.mark.parametrize("address", BAD, ids=range(len(BAD)))
def test_malformed_addresses_are_config_errors(address):
    with pytest.raises(ConfigError, match="is not a Ray address"):
        parse_address(address)


@pytest.mark.parametrize("address,want", GOOD.items(), ids=list(GOOD))
def test_well_formed_addresses(address, want):
    assert parse_address(address) == want


def test_a_malformed_address_on_the_command_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CK_CACHE_DIR", str(tmp_path))
    t0 = time.perf_counter()
    assert ck_main(["sweep", "gemm", "--arch", "sm90", "--executor", "ray", "--address", "127.0.0.1:x"]) == 2
    assert "is not a Ray address" in capsys.readouterr().err and time.perf_counter() - t0 < 10


def test_address_needs_the_ray_executor(tmp_path, monkeypatch):
    monkeypatch.setenv("CK_CACHE_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="--executor ray"):
        run_sweep(Options(op="gemm", arch="sm90", address="127.0.0.1:6379"))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_cluster_at_the_address_fails_within_seconds(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray instance is already running in this process")
    monkeypatch.setenv("CK_CACHE_DIR", str(tmp_path))
    shapes = tmp_path / "s.toml"
    shapes.write_text('[[shape]]\nname = "a"\ncategory = "smoke"\nm = 8\nn = 8\nk = 8\n')
    for address in (f"127.0.0.1:{_closed_port()}", f"ray://127.0.0.1:{_closed_port()}"):
        t0 = time.perf_counter()
        with pytest.raises(CkError, match="cannot reach a Ray cluster") as err:
            run_sweep(Options(op="gemm", arch="sm90", executor="ray", address=address, max_kernels=1,
                              shapes=str(shapes), enum_options={"dtypes": "fp16", "layouts": "rcr"},
                              csv=str(tmp_path / "o.csv"), progress=False))
        assert time.perf_counter() - t0 < 10 and "ray start --head" in str(err.value)
        assert not ray.is_initialized()
