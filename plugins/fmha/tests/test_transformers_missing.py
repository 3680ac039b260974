"""Without transformers, register() says which extra to install, at once (a fresh process in which
the import of transformers fails)."""
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

CODE = textwrap.dedent("""
    import sys, time
    sys.modules["transformers"] = None          # import transformers -> ImportError
    t0 = time.perf_counter()
    from ck_core.errors import PluginError
    import ck_fmha.integrations.transformers as ck_tf
    try:
        ck_tf.register()
    except PluginError as e:
        print("ERR", e)
    print("secs", time.perf_counter() - t0)
""")


def test_register_without_transformers_names_the_extra():
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ERR" in r.stdout and "pip install 'ck-fmha[transformers]'" in r.stdout, r.stdout
    assert float(r.stdout.split("secs")[1]) < 1.0 + 4.0, r.stdout   # imports of torch/triton included
