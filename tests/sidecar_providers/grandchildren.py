"""Starts two SIGTERM-ignoring grandchildren: one in its process group, one in a new session.

With ``--ignore-term`` the provider ignores SIGTERM as well.
"""

import signal
import subprocess
import sys

from sglang_sidecar_overlay.sidecar.proctree import read_stat

from sidecar_providers._report import sleep_forever, write_report

_GRANDCHILD = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "while True: time.sleep(3600)\n"
)


def _start_time(pid: int) -> int:
    stat = read_stat(pid)
    assert stat is not None, f"grandchild {pid} is gone"
    return stat.starttime


def main(argv: list[str]) -> None:
    if "--ignore-term" in argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    same_group = subprocess.Popen([sys.executable, "-c", _GRANDCHILD])
    new_session = subprocess.Popen([sys.executable, "-c", _GRANDCHILD], start_new_session=True)
    write_report(
        argv,
        grandchildren=[[p.pid, _start_time(p.pid)] for p in (same_group, new_session)],
    )
    sleep_forever()
