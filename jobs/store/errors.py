"""The store's own errors: each message says what is wrong and what to run."""


class StoreError(Exception):
    """The database cannot be used as asked (unreachable, wrong URL, bad request)."""


class DatabaseUnavailableError(StoreError):
    """The database did not take a request now: another process holds SQLite's write lock
    longer than the busy timeout, or the server cannot be reached (restarting, network). The
    request was rolled back whole; the same request may succeed later."""


class SchemaOutdatedError(StoreError):
    """The database is at an older migration than the code expects."""


class RunNotFoundError(StoreError):
    pass


class InvalidTransitionError(StoreError):
    pass


class SweepNotFoundError(StoreError):
    pass


class SweepClosedError(StoreError):
    """A run was to join a sweep that is no longer active (cancelled or finished meanwhile):
    nothing was stored."""


class TrialTakenError(StoreError):
    """A sweep's trial number already has its run: another pass queued it first."""


class StaleAttemptError(StoreError):
    """A write of an attempt that is over: the run was resumed as a newer attempt, or ended
    without it. Nothing of the write was kept; the worker that made it must stop."""


class SchemaNewerError(StoreError):
    """The database is at a migration this code does not know: a newer ES Lab migrated it."""
