"""The environment a test gives the services it starts."""

from __future__ import annotations

import os


def service_env(**extra: str) -> dict[str, str]:
    """This process's environment without its ENROUTE_* variables, plus ``extra``.

    A service reads every ENROUTE_* variable as configuration and refuses the ones
    that name no key, so a test switch such as ENROUTE_SEED=7 (how a failing seed is
    replayed) must not reach the processes the test starts.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENROUTE_")}
    env.update(extra)
    return env
