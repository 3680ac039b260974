"""A built kernel set travels as one ck-kernels-<arch> wheel and unpacks into a folder that
CK_KERNEL_SETS names (benchmarks/compile_count.py --prebuilt): what was packed comes back byte for
byte, and an archive that is not such a set, or would write outside the folder, is refused."""
import os
import zipfile

import pytest

from ck_core.errors import ConfigError
from ck_core.kernel_wheel import unpack_wheel, write_wheel


def _set(root):
    files = {}
    for i in range(3):
        sub = root / f"{i:02x}"
        sub.mkdir(parents=True)
        data = os.urandom(97 + 31 * i)
        (sub / f"{i:040x}.bin").write_bytes(data)
        (sub / f"{i:040x}.json").write_text('{"name": "k%d"}' % i)
        files[f"{i:02x}/{i:040x}.bin"] = data
    return files


def test_wheel_round_trip(tmp_path):
    files = _set(tmp_path / "set")
    whl = write_wheel(tmp_path / "set", "sm90", tmp_path / "w", preset="fa-suite")
    root = unpack_wheel(whl, tmp_path / "unpacked")
    assert root == tmp_path / "unpacked" / "ck_kernels_sm90" / "kernels"
    for rel, data in files.items():
        assert (root / rel).read_bytes() == data
    assert not list((tmp_path / "unpacked").glob("*.dist-info")), "only the kernels are unpacked"
    from ck_core.cache import KernelCache

    assert KernelCache(root, extra_roots=[]).stats()["entries"] == 3


@pytest.mark.parametrize("member, match", [
    ("ck_kernels_sm90/kernels/../../../evil.bin", "not a plain file path"),
    ("ck_kernels_sm90/kernels/a/./b.bin", "not a plain file path"),
])
def test_unpack_refuses_paths_outside_the_folder(tmp_path, member, match):
    whl = tmp_path / "bad.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("ck_kernels_sm90/kernels/ok/x.bin", b"ok")
        z.writestr(member, b"x")
    with pytest.raises(ConfigError, match=match):
        unpack_wheel(whl, tmp_path / "out")
    assert not (tmp_path / "evil.bin").exists() and not (tmp_path / "out").exists()


def test_unpack_refuses_what_is_not_a_kernel_set(tmp_path):
    junk = tmp_path / "junk.whl"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="not a kernel-set wheel"):
        unpack_wheel(junk, tmp_path / "out")
    other = tmp_path / "other.whl"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("pkg/__init__.py", "")
    with pytest.raises(ConfigError, match="no ck_kernels_<arch>/kernels/"):
        unpack_wheel(other, tmp_path / "out")
