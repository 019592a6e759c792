"""Exceptions of the pgqueue client."""

from __future__ import annotations

from datetime import timedelta
from typing import Union


class PgQueueError(Exception):
    """Base class of the errors this package raises."""


class WorkerSetupError(PgQueueError):
    """The worker cannot run as configured (extension missing, no privilege, ...)."""


class LeaseLost(PgQueueError):
    """``job.transaction()`` found the job no longer held by this worker (its
    lease was lost to another claim): the transaction was rolled back."""


class NeedsNewerExtension(PgQueueError):
    """The database's pgqueue lacks an object this call needs (pgqueue 1.1's
    admin functions; pgqueue 1.2's ``max_tries`` and ``after`` of ``push``
    and ``push_batch``, ``rate_limit`` and ``rate_period`` of
    ``configure``); the message
    names the version found and says to run ``ALTER EXTENSION pgqueue UPDATE``."""


class Retry(Exception):
    """Raise from a handler to give the job back with a delay of your choice.

    ``Retry(60)`` or ``Retry(timedelta(minutes=1), "rate limited")``: the job
    is nacked with ``retry_in`` set to the delay (``0`` retries at once), and
    the message recorded as its ``last_error``. It still counts as a try: a
    job out of tries goes to ``failed``.
    """

    def __init__(self, delay: Union[float, int, timedelta] = 0,
                 message: str = "retry requested by the handler") -> None:
        super().__init__(message)
        self.delay = delay if isinstance(delay, timedelta) else timedelta(seconds=delay)
        self.message = message
