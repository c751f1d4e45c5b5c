"""Delayed delivery: on a Shared (and a Key_Shared) subscription a message sent with
``deliver_after`` or ``deliver_at`` arrives no earlier than asked, and
messages sent after it are not held behind it; an Exclusive subscription
ignores delivery times (everything arrives at once, in order, as in Apache
Pulsar).

``--phase all`` runs that case. ``--phase send`` / ``--phase receive`` split
a restart case: ``send`` creates the Shared subscription, sends two delayed
messages (due time in property ``due``) and two plain ones, receives and acks
only the plain ones; ``receive`` (after a broker restart) expects exactly the
two delayed ones, each no earlier than its due time."""
import datetime
import time

import pulsar

import compat_util as u

DELAY_AFTER_S = 3
DELAY_AT_MS = 2000
RESTART_DELAY_MS = 8000


def now_ms():
    return int(time.time() * 1000)


def producer(client, args, topic):
    # Unbatched: a batch carries one delivery time for all its messages.
    return client.create_producer(topic, send_timeout_millis=args.timeout_ms,
                                  batching_enabled=False)


def timed_case(c, client, args, topic, consumer_type, label, exclusive_too):
    sub = client.subscribe(topic, f"delayed-{label}", consumer_type=consumer_type,
                           initial_position=pulsar.InitialPosition.Earliest)
    excl = None
    if exclusive_too:
        excl = client.subscribe(topic, "delayed-exclusive",
                                consumer_type=pulsar.ConsumerType.Exclusive,
                                initial_position=pulsar.InitialPosition.Earliest)
    p = producer(client, args, topic)
    due = {}
    due["after"] = now_ms() + DELAY_AFTER_S * 1000
    p.send(b"after", deliver_after=datetime.timedelta(seconds=DELAY_AFTER_S))
    due["at"] = now_ms() + DELAY_AT_MS
    p.send(b"at", deliver_at=due["at"])
    plain = [f"plain-{i}" for i in range(5)]
    for s in plain:
        p.send(s.encode())
    sent_done = now_ms()

    arrived = {}
    order = []
    while len(order) < 7:
        m = u.receive_or_none(sub, args.timeout_ms)
        if m is None:
            break
        order.append(u.text(m))
        arrived[u.text(m)] = now_ms()
        sub.acknowledge(m)
    order += u.drain_quiet(sub, 500)
    c.equal(f"{label}: every message arrives once",
            sorted(order), sorted(["after", "at"] + plain))
    c.equal(f"{label}: plain messages first, then the delayed ones by due time",
            order, plain + ["at", "after"])
    for name in ("after", "at"):
        got = arrived.get(name)
        c.check(f"{label}: {name!r} arrives no earlier than asked",
                got is not None and got >= due[name],
                arrived_ms=got, due_ms=due[name])
    last_plain = max((arrived.get(s, 0) for s in plain), default=0)
    c.check(f"{label}: plain messages are not held behind delayed ones",
            last_plain - sent_done < DELAY_AT_MS,
            last_plain_after_send_ms=last_plain - sent_done)

    if excl is not None:
        excl_got = []
        for _ in range(7):
            m = u.receive_or_none(excl, args.timeout_ms)
            if m is None:
                break
            excl_got.append(u.text(m))
            excl.acknowledge(m)
        c.equal("exclusive: delivery times ignored, topic order",
                excl_got, ["after", "at"] + plain)


def case_all(c, client, args, topic):
    timed_case(c, client, args, topic, pulsar.ConsumerType.Shared, "shared", True)
    timed_case(c, client, args, u.topic(args, "-ks"), pulsar.ConsumerType.KeyShared,
               "key_shared", False)


def phase_send(c, client, args, topic):
    shared = client.subscribe(topic, "delayed-restart", consumer_type=pulsar.ConsumerType.Shared,
                              initial_position=pulsar.InitialPosition.Earliest)
    p = producer(client, args, topic)
    for name in ("delayed-0", "delayed-1"):
        due = now_ms() + RESTART_DELAY_MS
        p.send(name.encode(), deliver_at=due, properties={"due": str(due)})
    for name in ("plain-0", "plain-1"):
        p.send(name.encode())
    got = []
    for _ in range(2):
        m = u.receive_or_none(shared, args.timeout_ms)
        if m is None:
            break
        got.append(u.text(m))
        shared.acknowledge(m)
    c.equal("send: only the plain messages arrive before the restart", got,
            ["plain-0", "plain-1"])
    shared.close()


def phase_receive(c, client, args, topic):
    shared = client.subscribe(topic, "delayed-restart", consumer_type=pulsar.ConsumerType.Shared,
                              initial_position=pulsar.InitialPosition.Earliest)
    got = []
    early = []
    deadline_ms = args.timeout_ms + RESTART_DELAY_MS
    for _ in range(2):
        m = u.receive_or_none(shared, deadline_ms)
        if m is None:
            break
        got.append(u.text(m))
        due = int(m.properties().get("due", "0"))
        at = now_ms()
        if at < due:
            early.append({"message": u.text(m), "arrived_ms": at, "due_ms": due})
        shared.acknowledge(m)
    got += u.drain_quiet(shared, 500)
    c.equal("receive: after the restart exactly the delayed messages arrive", got,
            ["delayed-0", "delayed-1"])
    c.equal("receive: none arrives before its due time", early, [])


def main():
    p = u.parser(__doc__)
    p.add_argument("--phase", choices=["all", "send", "receive"], default="all")
    args = u.parse(p)
    c = u.Checks()
    client = u.client(args)
    topic = u.topic(args)
    {"all": case_all, "send": phase_send, "receive": phase_receive}[args.phase](
        c, client, args, topic)
    u.finish(c)


u.run(main)
