"""Shared helpers of the compatibility scripts (see README.md in this directory).

Every script takes ``--url`` (``pulsar://host:port``) and ``--topic`` (a topic
name unique to the run), prints exactly one JSON object on its last stdout line
and exits 0 only if every check of the case held. Every receive is bounded by
``--timeout-ms`` and the whole script by ``--deadline-s`` (a watchdog thread
prints a failure line and exits the process), so a script never hangs.
"""
import argparse
import hashlib
import json
import os
import sys
import threading
import time

import pulsar

_printed = threading.Lock()


def parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--url", required=True, help="pulsar://host:port")
    p.add_argument("--topic", required=True, help="a topic name unique to this run")
    p.add_argument("--timeout-ms", type=int, default=10000,
                   help="bound on each receive and each operation, in milliseconds")
    p.add_argument("--deadline-s", type=float, default=60.0,
                   help="bound on the whole script, in seconds")
    return p


def parse(p):
    args = p.parse_args()
    _start_watchdog(args.deadline_s)
    return args


def _start_watchdog(deadline_s):
    def fire():
        emit({"ok": False, "error": f"script deadline of {deadline_s} s passed"})
        sys.stdout.flush()
        os._exit(3)

    t = threading.Timer(deadline_s, fire)
    t.daemon = True
    t.start()


def client(args):
    return pulsar.Client(
        args.url,
        operation_timeout_seconds=max(1, args.timeout_ms // 1000),
        connection_timeout_ms=args.timeout_ms,
    )


def topic(args, suffix=""):
    """The full topic name (short names live in public/default)."""
    name = args.topic + suffix
    return name if "://" in name else f"persistent://public/default/{name}"


def mid(message_id):
    """A message id as [ledger, entry, partition, batch_index]."""
    return [message_id.ledger_id(), message_id.entry_id(),
            message_id.partition(), message_id.batch_index()]


def text(msg):
    return msg.data().decode(errors="replace")


def digest(data):
    return hashlib.sha256(data).hexdigest()[:16]


def receive_or_none(consumer, timeout_ms):
    """One message, or None when nothing arrived within ``timeout_ms``."""
    try:
        return consumer.receive(timeout_millis=timeout_ms)
    except pulsar.Timeout:
        return None


def read_or_none(reader, timeout_ms):
    try:
        return reader.read_next(timeout_millis=timeout_ms)
    except pulsar.Timeout:
        return None


def drain_quiet(consumer, quiet_ms):
    """Payloads that arrive before ``quiet_ms`` pass without any message
    (used to show that nothing unexpected is delivered; bounded by the
    script deadline)."""
    extra = []
    while True:
        m = receive_or_none(consumer, quiet_ms)
        if m is None:
            return extra
        extra.append(text(m))
        consumer.acknowledge(m)


class Checks:
    """Collects named checks; the result line lists the failed ones."""

    def __init__(self):
        self.failed = []
        self.details = {}

    def check(self, name, cond, **detail):
        if not cond:
            self.failed.append({"check": name, **detail})
        return cond

    def equal(self, name, got, expected):
        return self.check(name, got == expected, got=got, expected=expected)


def emit(result):
    with _printed:
        print(json.dumps(result, default=str), flush=True)


def finish(checks, **result):
    ok = not checks.failed
    emit({"ok": ok, "failed": checks.failed, **checks.details, **result})
    sys.stdout.flush()
    os._exit(0 if ok else 1)


def fail(error, **result):
    emit({"ok": False, "error": error, **result})
    sys.stdout.flush()
    os._exit(2)


def run(main):
    """Runs ``main()``; an exception is a failure line naming it."""
    try:
        main()
    except Exception as e:  # noqa: BLE001 - any client error fails the case
        fail(f"{type(e).__name__}: {e}")


def now_ms():
    return int(time.time() * 1000)
