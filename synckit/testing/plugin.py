"""The pytest plugin synckit registers (entry point ``pytest11``: ``synckit``).

Installed with ``pip install 'synckit[testing]'``, it makes a connector author's test suite
work with no configuration:

* ``async def`` tests and fixtures run: pytest-asyncio's mode is set to ``auto`` unless
  the project chose a mode itself (``asyncio_mode`` in its ini file or on the command
  line), in which case its choice stands;
* the fixtures of :mod:`synckit.testing.fixtures` (``synckit_db``, ``synckit_clock``,
  ``instant_retries``, ``run_until_idle``, ``fake_api``) are available without
  ``pytest_plugins``;
* tenants' secret config fields and tokens are sealed as in production: when neither
  ``SYNCKIT_SECRET_KEY`` nor ``SYNCKIT_INSECURE_DEV_TOKENS`` is set, the session gets a
  throwaway key of its own (removed again when the session ends; processes the tests
  start inherit it);
* cassettes of ``@pytest.mark.vcr`` tests (pytest-recording) are scrubbed of secrets by
  default (:mod:`synckit.testing.cassettes`).

``-p no:synckit`` turns it off.
"""

from __future__ import annotations

import base64
import os
import warnings
from typing import Any

import pytest

FIXTURES = "synckit.testing.fixtures"
#: Set for the session when no key is configured (the names of synckit.runtime.credentials.secrets,
#: not imported here: the plugin loads in every pytest run of the environment).
SECRET_KEY_ENV = "SYNCKIT_SECRET_KEY"
INSECURE_ENV = "SYNCKIT_INSECURE_DEV_TOKENS"
_SET_KEY = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("asyncio") and not _mode_chosen(config):
        config.option.asyncio_mode = "auto"
    # Idempotent: a conftest that lists the module in pytest_plugins registered it already.
    config.pluginmanager.import_plugin(FIXTURES)
    if not os.environ.get(SECRET_KEY_ENV) and not os.environ.get(INSECURE_ENV):
        # A Fernet key is 32 random bytes, url-safe base64.
        os.environ[SECRET_KEY_ENV] = base64.urlsafe_b64encode(os.urandom(32)).decode()
        config.stash[_SET_KEY] = True


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.stash.get(_SET_KEY, False):
        os.environ.pop(SECRET_KEY_ENV, None)


def _mode_chosen(config: pytest.Config) -> bool:
    if config.getoption("asyncio_mode", default=None):
        return True
    # getini() answers the default for an unset option: only the raw ini says whether
    # the project chose. (pytest deprecates inicfg in favour of getini, which cannot.)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return "asyncio_mode" in config.inicfg


@pytest.hookimpl(optionalhook=True)
def pytest_recording_configure(config: pytest.Config, vcr: Any) -> None:
    """pytest-recording's hook: every cassette it opens scrubs secrets before writing."""
    from synckit.testing.cassettes import install_scrubbing

    install_scrubbing(vcr)
