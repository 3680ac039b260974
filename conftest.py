pytest_plugins = ["ck_core.testing"]
