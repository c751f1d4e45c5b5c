"""Resume from the cursor. Phase `first`: consume the first half, ack all of
it except one message, receive two more without acking, close. Phase `rest`
(a new client, so a new connection; the Rust test may restart the broker in
between): the same subscription receives exactly the unacked messages, in
order: the skipped one, the two received-but-unacked ones, then the rest; no
acked message comes back. Phase `all` runs both with one script."""
import pulsar

import compat_util as u

COUNT = 20
HALF = COUNT // 2
SKIPPED = 4


def subscribe(client, args):
    return client.subscribe(u.topic(args), "resume",
                            consumer_type=pulsar.ConsumerType.Exclusive,
                            initial_position=pulsar.InitialPosition.Earliest)


def payloads():
    return [f"resume-{i}" for i in range(COUNT)]


def first(c, args):
    client = u.client(args)
    consumer = subscribe(client, args)
    producer = client.create_producer(u.topic(args), send_timeout_millis=args.timeout_ms)
    for s in payloads():
        producer.send(s.encode())
    producer.close()
    got = []
    for i in range(HALF + 2):
        m = u.receive_or_none(consumer, args.timeout_ms)
        if m is None:
            break
        got.append(u.text(m))
        if i < HALF and i != SKIPPED:
            consumer.acknowledge(m)
    c.equal("first phase receives the first half and two more", got, payloads()[:HALF + 2])
    consumer.close()
    client.close()
    return got


def rest(c, args):
    client = u.client(args)
    consumer = subscribe(client, args)
    expected = [payloads()[SKIPPED]] + payloads()[HALF:]
    got = []
    while len(got) < len(expected):
        m = u.receive_or_none(consumer, args.timeout_ms)
        if m is None:
            break
        got.append(u.text(m))
        consumer.acknowledge(m)
    got += u.drain_quiet(consumer, 500)
    c.equal("after resubscribing: exactly the unacked messages, in order", got, expected)
    consumer.close()
    client.close()
    return got


def main():
    p = u.parser(__doc__)
    p.add_argument("--phase", choices=["first", "rest", "all"], default="all")
    args = u.parse(p)
    c = u.Checks()
    out = {}
    if args.phase in ("first", "all"):
        out["first"] = first(c, args)
    if args.phase in ("rest", "all"):
        out["rest"] = rest(c, args)
    u.finish(c, phase=args.phase, **out)


u.run(main)
