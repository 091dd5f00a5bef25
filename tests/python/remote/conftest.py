"""The `s3` marker and the `seaweed_s3` fixture for the tests in this directory (servers on 127.0.0.1 only).

A conftest elsewhere gets the same shared server with `seaweed_s3 = seaweed_s3_fixture()`
(`from remote.seaweed import seaweed_s3_fixture`): one weed process serves every module of a session.
"""

from __future__ import annotations

import pytest

from .seaweed import seaweed_s3_fixture


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "s3: needs SeaweedFS's weed binary (select with -m s3, skip with -m 'not s3')")


seaweed_s3 = seaweed_s3_fixture()
