"""Fixtures of the node agent's tests: the guard's and the broker's in one agent.

The agent's parts are tested where their policy is (tests/guard: the guard's
policy; tests/broker: the room policy; tests/adversarial: lies told to
both); here is what belongs to the agent as one program: both policies in one
process, one actor, one socket. The fixtures are tests/native's and
tests/broker's (broker_fixtures.py: ``slices``, ``holder``, ``client``,
``start_agent``...).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "native"))
sys.path.insert(0, str(HERE.parent / "broker"))

from native_fixtures import cudrive, gpu, hami_build  # noqa: E402,F401 (fixtures)
from broker_fixtures import client, holder, root, slices, socket_path, start_agent, start_broker  # noqa: E402,F401
