"""The store's own errors: each message says what is wrong and what to run."""


class StoreError(Exception):
    """The database cannot be used as asked (unreachable, wrong URL, bad request)."""


class SchemaOutdatedError(StoreError):
    """The database is at an older migration than the code expects."""


class RunNotFoundError(StoreError):
    pass


class InvalidTransitionError(StoreError):
    pass


class SchemaNewerError(StoreError):
    """The database is at a migration this code does not know: a newer ES Lab migrated it."""
