r"""A bounded copy of a failed foreachBatch write's error, for Spark; the whole error goes to the driver's log.

When a query stops, Spark decides whether a foreachBatch error was the stop's interruption by matching a regular
expression of the form `Py4JJavaError: An error occurred while calling((.|\n)*)InterruptedException` over the
error's whole text. Java's regex engine recurses once per character there, so a text of a couple of thousand
characters (any Java stack trace: a cancelled job's is tens of thousands) overflows the stream thread's stack: the
thread dies with a StackOverflowError of a thousand lines instead of stopping cleanly. The copy Spark gets keeps the
error's first line and the Java exception names in it, so the match still works and stays short.
"""

from __future__ import annotations

import re

from shardherd.shared.errors import ShardherdError

MESSAGE_LIMIT = 400
JAVA_EXCEPTION = re.compile(r"\b(?:[a-z_][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error)\b")
INTERRUPTIONS = ("java.lang.InterruptedException", "java.io.InterruptedIOException",
                 "java.nio.channels.ClosedByInterruptException")


class BatchWriteFailed(ShardherdError, RuntimeError):
    """The user's write of a micro-batch raised; the message is a short summary (the full error is logged)."""


def summary(exc: BaseException, limit: int = MESSAGE_LIMIT) -> str:
    """`module.Class: first line` of the error and the distinct Java exception names in its text, in `limit` chars.

    The first line takes at most half; names follow, interruptions first (Spark's stop check looks for them), then
    as many others as fit.
    """
    kind = type(exc)
    text = str(exc)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    head = f"{kind.__module__}.{kind.__qualname__}: {first}"
    if len(head) > limit // 2:
        head = head[:limit // 2 - 3] + "..."
    found = list(dict.fromkeys(JAVA_EXCEPTION.findall(text)))
    names = [name for name in found if name in INTERRUPTIONS] + [name for name in found if name not in INTERRUPTIONS]
    kept: list[str] = []
    for name in names:
        if len(head) + len(" [, ...]") + sum(len(item) + 2 for item in [*kept, name]) > limit:
            break
        kept.append(name)
    if not kept:
        return head
    more = ", ..." if len(kept) < len(names) else ""
    return f"{head} [{', '.join(kept)}{more}]"


def is_interruption(exc: BaseException) -> bool:
    """True if the error's text names a Java interruption (the query is being stopped under a running job)."""
    text = str(exc)
    return any(name in text for name in INTERRUPTIONS)
