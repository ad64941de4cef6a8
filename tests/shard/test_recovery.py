"""Whether a scheduler process is alive decides whether its runs are closed and killed: only a
process that is really gone may count as dead."""

import os
import resource
import socket

from shard.recovery import current_runner_id, runner_alive


def test_a_live_runner_stays_alive_when_proc_cannot_be_read_for_want_of_file_descriptors():
    me = current_runner_id()
    gone = f"{socket.gethostname()}:999999999:0"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        try:
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        alive_without_descriptors = runner_alive(me)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert alive_without_descriptors
    assert runner_alive(me)
    assert not runner_alive(gone)
