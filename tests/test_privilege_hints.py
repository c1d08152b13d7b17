"""A hint never tells an agent running as root to run as root (issue 15); an unprivileged one still gets it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inferwatch.agent.config import RuntimeSettings
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.host.runtime import RuntimeLocator
from tests.conftest import free_port


def test_no_listener_hint_as_root_does_not_say_run_as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the root branch needs the test command to run as root (as CI does)")
    with pytest.raises(NoDataError) as exc:
        RuntimeLocator(RuntimeSettings(), Path("/proc")).find_serving(free_port())
    assert exc.value.hint and "as root" not in exc.value.hint.replace("runs as root already", "")
    assert "runtime.pid" in exc.value.hint and "namespace" in exc.value.hint


def test_no_listener_hint_unprivileged_says_run_as_root() -> None:
    """The same lookup with the effective uid dropped to nobody (65534): the root advice is right there."""
    if os.geteuid() != 0:
        pytest.skip("dropping to another user needs root")
    locator = RuntimeLocator(RuntimeSettings(), Path("/proc"))
    port = free_port()
    os.seteuid(65534)
    try:
        with pytest.raises(NoDataError) as exc:
            locator.find_serving(port)
    finally:
        os.seteuid(0)
    assert exc.value.hint and exc.value.hint.startswith("set runtime.pid or run as root")
