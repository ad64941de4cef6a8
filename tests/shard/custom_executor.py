"""An executor of another kind, for the tests that plug one in without touching the scheduler."""

from dataclasses import replace

from shard.run.executor import LocalExecutor, RunHandle, RunSpec


class TaggingExecutor(LocalExecutor):
    """Runs the command locally after a line naming this executor, as a wrapper (ssh, adb shell) would."""

    def start(self, spec: RunSpec) -> RunHandle:
        return super().start(replace(spec, command=f"echo 'via TaggingExecutor'; {spec.command}"))
