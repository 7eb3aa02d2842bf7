"""The one error type users see: a cause and a fix, printed on one line."""


class GpucrError(Exception):
    """A failure the user can act on.

    `cause` says what went wrong, `fix` says what to do about it. The CLI prints
    both on one line and exits with `exit_code`; nothing else is printed.
    """

    def __init__(self, cause: str, fix: str = "", exit_code: int = 1):
        super().__init__(cause)
        self.cause = cause
        self.fix = fix
        self.exit_code = exit_code

    def one_line(self) -> str:
        text = self.cause.rstrip(".")
        if self.fix:
            text += f"; {self.fix}"
        return " ".join(text.split())


class NoGpuState(GpucrError):
    """A process tree with no GPU process and no shim: nothing of it to yield."""


class NotCheckpointed(GpucrError):
    """A process tree with nothing checkpointed: nothing of it to restore."""
