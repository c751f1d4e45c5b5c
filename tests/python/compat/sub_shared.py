"""Shared subscription: two consumers together receive every message exactly
once when every message is acked, and both take part."""
import pulsar

import compat_util as u

COUNT = 100


def main():
    args = u.parse(u.parser(__doc__))
    c = u.Checks()
    client = u.client(args)
    topic = u.topic(args)
    consumers = [
        client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared,
                         consumer_name=f"shared-{i}", receiver_queue_size=10)
        for i in range(2)
    ]
    producer = client.create_producer(topic, send_timeout_millis=args.timeout_ms)
    sent = [f"shared-{i}" for i in range(COUNT)]
    for s in sent:
        producer.send(s.encode())

    got = [[], []]
    idle_rounds = 0
    # Alternate between the consumers with short waits until everything
    # arrived or both stayed silent for a whole receive timeout.
    while sum(len(g) for g in got) < COUNT and idle_rounds * 200 < args.timeout_ms:
        progressed = False
        for i, consumer in enumerate(consumers):
            m = u.receive_or_none(consumer, 100)
            if m is not None:
                got[i].append(u.text(m))
                consumer.acknowledge(m)
                progressed = True
        idle_rounds = 0 if progressed else idle_rounds + 1
    # Nothing more may arrive: every message was acked once.
    extra = [u.drain_quiet(consumer, 500) for consumer in consumers]
    union = sorted(got[0] + got[1] + extra[0] + extra[1])
    c.equal("every message exactly once across both consumers", union, sorted(sent))
    c.check("both consumers received messages", len(got[0]) > 0 and len(got[1]) > 0,
            counts=[len(got[0]), len(got[1])])
    for consumer in consumers:
        consumer.close()
    u.finish(c, counts=[len(got[0]), len(got[1])], extra=extra)


u.run(main)
