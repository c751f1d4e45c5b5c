"""Negative acks and ack timeouts: a negatively acked message comes back
with a redelivery count one higher each time (Shared: per message; Exclusive:
the client rewinds all unacked), and an unacked message comes back after the
ack timeout (C++ clients allow no timeout below 10 s)."""
import time

import pulsar

import compat_util as u

ROUNDS = 3


def nack_rounds(c, client, topic, sub_type, payloads, timeout_ms):
    name = str(sub_type).split(".")[-1]
    consumer = client.subscribe(topic, f"nack-{name}", consumer_type=sub_type,
                                initial_position=pulsar.InitialPosition.Earliest,
                                negative_ack_redelivery_delay_ms=100)
    rounds = []
    for r in range(ROUNDS + 1):
        seen = {}
        while len(seen) < len(payloads):
            m = u.receive_or_none(consumer, timeout_ms)
            if m is None:
                break
            seen[u.text(m)] = m.redelivery_count()
            if r < ROUNDS:
                consumer.negative_acknowledge(m)
            else:
                consumer.acknowledge(m)
        rounds.append(seen)
        c.equal(f"{name} round {r}: every message arrives", sorted(seen), sorted(payloads))
        c.equal(f"{name} round {r}: redelivery counts", seen, {p: r for p in payloads})
    extra = u.drain_quiet(consumer, 500)
    c.equal(f"{name}: nothing after the final acks", extra, [])
    consumer.close()
    return rounds


def main():
    p = u.parser(__doc__)
    p.add_argument("--ack-timeout-ms", type=int, default=10000)
    args = u.parse(p)
    c = u.Checks()
    client = u.client(args)
    producer = client.create_producer(u.topic(args, "-shared"),
                                      send_timeout_millis=args.timeout_ms)
    shared_payloads = [f"nack-shared-{i}" for i in range(3)]
    for s in shared_payloads:
        producer.send(s.encode())
    producer.close()
    shared = nack_rounds(c, client, u.topic(args, "-shared"), pulsar.ConsumerType.Shared,
                         shared_payloads, args.timeout_ms)

    # Exclusive: one unacked message at a time, so each nack is one rewind.
    producer = client.create_producer(u.topic(args, "-excl"),
                                      send_timeout_millis=args.timeout_ms)
    producer.send(b"nack-excl-0")
    producer.close()
    excl = nack_rounds(c, client, u.topic(args, "-excl"), pulsar.ConsumerType.Exclusive,
                       ["nack-excl-0"], args.timeout_ms)

    # Ack timeout: receive without acking; the message comes back by itself.
    topic = u.topic(args, "-acktimeout")
    consumer = client.subscribe(topic, "ack-timeout", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest,
                                unacked_messages_timeout_ms=args.ack_timeout_ms)
    producer = client.create_producer(topic, send_timeout_millis=args.timeout_ms)
    producer.send(b"ack-timeout-0")
    m = u.receive_or_none(consumer, args.timeout_ms)
    c.equal("ack timeout: first delivery", m and (u.text(m), m.redelivery_count()),
            ("ack-timeout-0", 0))
    received_at = time.monotonic()
    m = u.receive_or_none(consumer, args.ack_timeout_ms * 3)
    waited_ms = int((time.monotonic() - received_at) * 1000)
    c.equal("ack timeout: redelivered without an ack",
            m and (u.text(m), m.redelivery_count()), ("ack-timeout-0", 1))
    c.check("ack timeout: not redelivered before the timeout",
            waited_ms >= args.ack_timeout_ms * 0.9, waited_ms=waited_ms)
    if m is not None:
        consumer.acknowledge(m)
    consumer.close()
    u.finish(c, shared_rounds=shared, exclusive_rounds=excl, ack_timeout_waited_ms=waited_ms)


u.run(main)
